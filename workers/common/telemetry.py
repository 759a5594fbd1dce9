"""Traces and metrics for the server processes: OpenTelemetry providers,
exporters chosen by configuration, Temporal's tracing interceptor, and the
Temporal SDK's own metrics routed into the same meter provider.

Exporters: `otlp` (gRPC; the standard OTEL_EXPORTER_OTLP_* variables say
where), `console`, or `none` (the default). `--metrics-port` adds a Prometheus
endpoint. OTEL_TRACES_EXPORTER, OTEL_METRICS_EXPORTER and OTEL_SERVICE_NAME
apply where no flag is given.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    ConsoleMetricExporter,
    MetricReader,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
from pydantic import BaseModel, Field
from temporalio.client import Interceptor
from temporalio.contrib.opentelemetry import MetricsExporter, TracingInterceptor
from temporalio.runtime import MetricBuffer, MetricBufferDurationFormat, Runtime, TelemetryConfig

from timeshare.workers.common.service import StartupError

Exporter = Literal["none", "console", "otlp"]
# Temporal's core drops buffered SDK metrics it cannot hand over; the
# exporter drains the buffer every second, far below this.
SDK_METRIC_BUFFER = 10_000


class TelemetrySettings(BaseModel):
    service: str
    traces: Exporter = "none"
    metrics: Exporter = "none"
    metrics_port: int | None = Field(default=None, ge=1, le=65535)

    @classmethod
    def resolve(
        cls,
        service: str,
        traces: str | None,
        metrics: str | None,
        metrics_port: int | None,
        environ: Mapping[str, str] | None = None,
    ) -> TelemetrySettings:
        env = os.environ if environ is None else environ
        return cls(
            service=env.get("OTEL_SERVICE_NAME") or service,
            traces=_exporter("traces", traces or env.get("OTEL_TRACES_EXPORTER") or "none"),
            metrics=_exporter("metrics", metrics or env.get("OTEL_METRICS_EXPORTER") or "none"),
            metrics_port=metrics_port,
        )

    @property
    def tracing(self) -> bool:
        return self.traces != "none"

    @property
    def metering(self) -> bool:
        return self.metrics != "none" or self.metrics_port is not None


def _exporter(kind: str, value: str) -> Exporter:
    if value not in ("none", "console", "otlp"):
        raise StartupError(f"--{kind} (or OTEL_{kind.upper()}_EXPORTER): use otlp, console or none")
    return value  # type: ignore[return-value]  # checked just above


class Telemetry:
    """What a process hands to Temporal, and what it must flush at exit."""

    def __init__(
        self,
        interceptors: Sequence[Interceptor] = (),
        runtime: Runtime | None = None,
        exporter: MetricsExporter | None = None,
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
    ) -> None:
        self.interceptors = list(interceptors)
        self.runtime = runtime
        self._exporter = exporter
        self._tracer_provider = tracer_provider
        self._meter_provider = meter_provider
        self._task: asyncio.Task[None] | None = None

    @classmethod
    def with_global_providers(cls) -> Telemetry:
        """Trace through whatever providers are installed (tests install in-memory ones)."""
        return cls(interceptors=[TracingInterceptor()])

    def start(self) -> None:
        if self._exporter is not None:
            self._task = asyncio.get_running_loop().create_task(self._exporter.run())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._tracer_provider is not None:
            self._tracer_provider.shutdown()
        if self._meter_provider is not None:
            self._meter_provider.shutdown()

    def describe(self) -> str:
        parts = []
        if self._tracer_provider is not None:
            parts.append("traces")
        if self._meter_provider is not None:
            parts.append("metrics")
        return ", ".join(parts) or "no telemetry"


def setup_telemetry(settings: TelemetrySettings) -> Telemetry:
    """Install global providers as configured; with nothing configured, change nothing."""
    if not settings.tracing and not settings.metering:
        return Telemetry()
    resource = Resource.create({"service.name": settings.service})
    tracer_provider = None
    interceptors: list[Interceptor] = []
    if settings.tracing:
        tracer_provider = TracerProvider(resource=resource)
        tracer_provider.add_span_processor(BatchSpanProcessor(_span_exporter(settings.traces)))
        trace.set_tracer_provider(tracer_provider)
        interceptors.append(TracingInterceptor())
    meter_provider = None
    runtime = None
    exporter = None
    if settings.metering:
        meter_provider = MeterProvider(resource=resource, metric_readers=_readers(settings))
        metrics.set_meter_provider(meter_provider)
        buffer = MetricBuffer(SDK_METRIC_BUFFER, MetricBufferDurationFormat.SECONDS)
        runtime = Runtime(telemetry=TelemetryConfig(metrics=buffer))
        exporter = MetricsExporter(buffer, meter_provider)
    return Telemetry(interceptors, runtime, exporter, tracer_provider, meter_provider)


def _span_exporter(kind: Exporter) -> Any:
    if kind == "console":
        return ConsoleSpanExporter()
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()


def _readers(settings: TelemetrySettings) -> list[MetricReader]:
    readers: list[MetricReader] = []
    if settings.metrics == "console":
        readers.append(PeriodicExportingMetricReader(ConsoleMetricExporter()))
    elif settings.metrics == "otlp":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter

        readers.append(PeriodicExportingMetricReader(OTLPMetricExporter()))
    if settings.metrics_port is not None:
        from opentelemetry.exporter.prometheus import PrometheusMetricReader
        from prometheus_client import start_http_server

        try:
            start_http_server(settings.metrics_port)
        except OSError as error:
            raise StartupError(
                f"--metrics-port {settings.metrics_port}: {error.strerror}; choose a free port"
            ) from None
        readers.append(PrometheusMetricReader())
    return readers
