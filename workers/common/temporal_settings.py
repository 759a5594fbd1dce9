"""How a timeshare process reaches Temporal: Temporal's own environment
configuration (temporalio.envconfig), so a Temporal user's settings just work.

Sources, highest first: command-line flags; the standard variables
(`TEMPORAL_ADDRESS`, `TEMPORAL_NAMESPACE`, `TEMPORAL_API_KEY`, `TEMPORAL_TLS*`,
`TEMPORAL_PROFILE`, `TEMPORAL_CONFIG_FILE`, `TEMPORAL_GRPC_META_*`); the
profile in the TOML config file (default `~/.config/temporalio/temporal.toml`);
the defaults (localhost:7233, namespace default). Flags are applied as those
same variables, so envconfig alone merges every source and reads every
certificate. The older `TIMESHARE_TEMPORAL*` variables still work, each with a
deprecation line.

One setting is timeshare's own, as envconfig has none for it: gRPC
compression (`--temporal-compression`, `TIMESHARE_TEMPORAL_COMPRESSION`),
`none` unless asked. The SDK's default, gzip, compresses every poll and
every workflow task's completion, and has the server compress its answers:
about 4 % of the scheduler's CPU per hand-over (docs/benchmarks.md,
"Scale") for messages of a few hundred bytes. `gzip` suits a
Temporal reached over a slow link.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, cast, get_args

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError
from temporalio.envconfig import ClientConfigProfile
from temporalio.service import GrpcCompression, TLSConfig

DEFAULT_ADDRESS = "localhost:7233"
DEFAULT_NAMESPACE = "default"

# A flag's setting name -> the envconfig variable it stands for.
FLAG_VARIABLES = {
    "address": "TEMPORAL_ADDRESS",
    "namespace": "TEMPORAL_NAMESPACE",
    "profile": "TEMPORAL_PROFILE",
    "config_file": "TEMPORAL_CONFIG_FILE",
    "api_key": "TEMPORAL_API_KEY",
    "tls": "TEMPORAL_TLS",
    "tls_ca": "TEMPORAL_TLS_SERVER_CA_CERT_PATH",
    "tls_cert": "TEMPORAL_TLS_CLIENT_CERT_PATH",
    "tls_key": "TEMPORAL_TLS_CLIENT_KEY_PATH",
    "tls_server_name": "TEMPORAL_TLS_SERVER_NAME",
}
# Settings envconfig does not know: the flag's setting name -> timeshare's variable.
OWN_VARIABLES = {
    "compression": "TIMESHARE_TEMPORAL_COMPRESSION",
    "wait_seconds": "TIMESHARE_TEMPORAL_WAIT",
}
# How long a service started before Temporal (or during its restart) waits
# for it before it exits with the reason: long enough for a Temporal
# cluster's own start, and what the Kubernetes startup probes allow
# (deploy/kubernetes/base). 0: for ever.
DEFAULT_WAIT_SECONDS = 300.0
Compression = Literal["none", "gzip"]
COMPRESSIONS: tuple[str, ...] = get_args(Compression)
# Variables of earlier releases -> the standard variable that replaces each.
DEPRECATED_VARIABLES = {
    "TIMESHARE_TEMPORAL": "TEMPORAL_ADDRESS",
    "TIMESHARE_NAMESPACE": "TEMPORAL_NAMESPACE",
    "TIMESHARE_TEMPORAL_TLS": "TEMPORAL_TLS",
    "TIMESHARE_TEMPORAL_TLS_CA": "TEMPORAL_TLS_SERVER_CA_CERT_PATH",
    "TIMESHARE_TEMPORAL_TLS_CERT": "TEMPORAL_TLS_CLIENT_CERT_PATH",
    "TIMESHARE_TEMPORAL_TLS_KEY": "TEMPORAL_TLS_CLIENT_KEY_PATH",
    "TIMESHARE_TEMPORAL_TLS_SERVER_NAME": "TEMPORAL_TLS_SERVER_NAME",
    "TIMESHARE_TEMPORAL_API_KEY": "TEMPORAL_API_KEY",
}
# Where a certificate path may have come from, to name it when it is unreadable.
PATH_VARIABLES = {
    "TEMPORAL_TLS_SERVER_CA_CERT_PATH": "--temporal-tls-ca",
    "TEMPORAL_TLS_CLIENT_CERT_PATH": "--temporal-tls-cert",
    "TEMPORAL_TLS_CLIENT_KEY_PATH": "--temporal-tls-key",
}


class SettingsError(ValueError):
    """Bad settings; the message is one line naming what is wrong."""


class TemporalSettings(BaseModel):
    """The connection every timeshare process makes to Temporal."""

    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid")

    address: str = Field(default=DEFAULT_ADDRESS, pattern=r"^[^\s:]+:\d{1,5}$")
    namespace: str = Field(default=DEFAULT_NAMESPACE, min_length=1, max_length=1000)
    api_key: SecretStr | None = None
    # False, True (system roots) or the certificates; never shown (a client key).
    tls: TLSConfig | bool = Field(default=False, repr=False)
    rpc_metadata: dict[str, str] = Field(default_factory=dict, repr=False)
    profile: str = "default"
    compression: Compression = "none"
    wait_seconds: float = Field(default=DEFAULT_WAIT_SECONDS, ge=0.0)

    @property
    def uses_tls(self) -> bool:
        return self.tls is not False

    def tls_config(self) -> TLSConfig | bool:
        return self.tls

    def grpc_compression(self) -> GrpcCompression:
        return GrpcCompression.GZIP if self.compression == "gzip" else GrpcCompression.NONE

    def describe(self) -> str:
        """For logs: never the key."""
        extras = []
        if self.uses_tls:
            mutual = isinstance(self.tls, TLSConfig) and self.tls.client_cert is not None
            extras.append("mTLS" if mutual else "TLS")
        extras += ["API key"] if self.api_key else []
        suffix = f" ({', '.join(extras)})" if extras else ""
        return f"{self.address}/{self.namespace}{suffix}"


def load_temporal_settings(
    flags: Mapping[str, Any], environ: Mapping[str, str] | None = None
) -> TemporalSettings:
    """Merge flags (only those given, by FLAG_VARIABLES names) over the
    environment over the config file's profile. Raises SettingsError."""
    variables = _with_deprecated_variables(dict(os.environ if environ is None else environ))
    for name, value in flags.items():
        if value is None or value is False:
            continue
        variable = FLAG_VARIABLES.get(name) or OWN_VARIABLES.get(name)
        if variable is None:
            raise SettingsError(f"unknown Temporal setting {name!r}")
        variables[variable] = "true" if value is True else str(value)
    compression = _compression(variables)
    config_file = variables.get("TEMPORAL_CONFIG_FILE")
    if config_file and not Path(config_file).is_file():
        raise SettingsError(f"Temporal config file {config_file} does not exist")
    if bool(variables.get("TEMPORAL_TLS_CLIENT_CERT_PATH")) != bool(
        variables.get("TEMPORAL_TLS_CLIENT_KEY_PATH")
    ):
        raise SettingsError("a client certificate and its key go together (mTLS)")
    try:
        profile = ClientConfigProfile.load(
            profile=variables.get("TEMPORAL_PROFILE") or None,
            config_source=Path(config_file) if config_file else None,
            config_file_strict=True,
            override_env_vars=variables,
        )
        connect = profile.to_client_connect_config()
    except FileNotFoundError as error:
        path = _named_path(error.filename, variables)
        raise SettingsError(f"{path} is not a readable file") from None
    except Exception as error:  # envconfig's own ConfigError and TOML errors
        raise SettingsError(f"Temporal settings: {_one_line(error)}") from None
    try:
        return TemporalSettings(
            address=connect.get("target_host") or DEFAULT_ADDRESS,
            namespace=connect.get("namespace", DEFAULT_NAMESPACE),
            api_key=SecretStr(connect["api_key"]) if "api_key" in connect else None,
            tls=connect.get("tls", False),
            rpc_metadata=dict(connect.get("rpc_metadata", {})),
            profile=variables.get("TEMPORAL_PROFILE") or "default",
            compression=compression,
            wait_seconds=_wait_seconds(variables),
        )
    except ValidationError as error:
        raise SettingsError(_problems(error)) from None


def _compression(variables: Mapping[str, str]) -> Compression:
    value = variables.get(OWN_VARIABLES["compression"]) or "none"
    if value not in COMPRESSIONS:
        raise SettingsError(
            f"--temporal-compression / {OWN_VARIABLES['compression']}: {value!r} is not "
            f"one of {', '.join(COMPRESSIONS)}"
        )
    return cast(Compression, value)


def _wait_seconds(variables: Mapping[str, str]) -> float:
    value = variables.get(OWN_VARIABLES["wait_seconds"])
    if not value:
        return DEFAULT_WAIT_SECONDS
    try:
        return float(value)
    except ValueError:
        raise SettingsError(
            f"--temporal-wait / {OWN_VARIABLES['wait_seconds']}: {value!r} is not a number "
            "of seconds"
        ) from None


def _with_deprecated_variables(variables: dict[str, str]) -> dict[str, str]:
    if variables.get("TIMESHARE_CONFIG"):
        raise SettingsError(
            "TIMESHARE_CONFIG ([temporal] table) is no longer read: put the settings in a "
            "profile of a Temporal config file (TEMPORAL_CONFIG_FILE; see docs/security.md)"
        )
    for old, new in DEPRECATED_VARIABLES.items():
        if not variables.get(old):
            continue
        print(f"timeshare: {old} is deprecated; set {new} instead", file=sys.stderr)
        variables.setdefault(new, variables[old])
    return variables


def _named_path(path: str | None, variables: Mapping[str, str]) -> str:
    for variable, flag in PATH_VARIABLES.items():
        if path and variables.get(variable) == path:
            return f"{flag} / {variable}: {path}"
    return str(path)


def _one_line(error: Exception) -> str:
    lines = [line.strip(" |^") for line in str(error).splitlines()]
    return " ".join(line for line in lines if line)


def _problems(error: ValidationError) -> str:
    lines = []
    for problem in error.errors():
        where = ".".join(str(part) for part in problem["loc"])
        lines.append(f"temporal.{where}: {problem['msg']}")
    return "; ".join(lines)
