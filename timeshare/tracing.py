"""Client spans: each call to the gateway carries the caller's OpenTelemetry
trace context, so a job's acquire and the switch it causes share one trace.

A no-op until the application installs a tracer provider. Done here rather
than with a gRPC channel interceptor, which would stop a cancelled asyncio
call from cancelling its RPC (and so from giving back a waiter's place)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from opentelemetry import propagate, trace

_tracer = trace.get_tracer("timeshare.client")
Metadata = tuple[tuple[str, str], ...]


@contextmanager
def client_span(method: object, metadata: Sequence[tuple[str, str]]) -> Iterator[Metadata]:
    """A CLIENT span for one RPC; yields the metadata to send, trace context added."""
    name = _rpc_name(method)
    service, _, rpc = name.strip("/").rpartition("/")
    attributes = {"rpc.system": "grpc", "rpc.service": service, "rpc.method": rpc}
    with _tracer.start_as_current_span(
        name, kind=trace.SpanKind.CLIENT, attributes=attributes
    ) as span:
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        try:
            yield (*metadata, *carrier.items())
        except Exception as error:
            span.set_status(trace.StatusCode.ERROR, str(error))
            raise


def _rpc_name(method: object) -> str:
    # The generated stub's callables know their full method name.
    raw = getattr(method, "_method", b"")
    return raw.decode() if isinstance(raw, bytes) else str(raw or "rpc")
