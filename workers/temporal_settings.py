"""How a timeshare process reaches Temporal: address, namespace, TLS or mTLS,
and an API key (Temporal Cloud).

Each setting comes from, in order of precedence: a command-line flag, an
environment variable, the `[temporal]` table of the config file (--config or
TIMESHARE_CONFIG), the default. Validated by pydantic, so every bad field gets
its own clear line.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, model_validator
from temporalio.service import TLSConfig

from timeshare.workers.toml_file import TomlFileError, read_toml

DEFAULT_ADDRESS = "localhost:7233"
# setting name -> environment variable
ENVIRONMENT = {
    "address": "TIMESHARE_TEMPORAL",
    "namespace": "TIMESHARE_NAMESPACE",
    "tls": "TIMESHARE_TEMPORAL_TLS",
    "tls_ca": "TIMESHARE_TEMPORAL_TLS_CA",
    "tls_cert": "TIMESHARE_TEMPORAL_TLS_CERT",
    "tls_key": "TIMESHARE_TEMPORAL_TLS_KEY",
    "tls_server_name": "TIMESHARE_TEMPORAL_TLS_SERVER_NAME",
    "api_key": "TIMESHARE_TEMPORAL_API_KEY",
}


class SettingsError(ValueError):
    """Bad settings; the message has one line per bad field."""


class TemporalSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    address: str = Field(default=DEFAULT_ADDRESS, pattern=r"^[^\s:]+:\d{1,5}$")
    namespace: str = Field(default="default", min_length=1, max_length=1000)
    # TLS with the system's roots; implied by any of the tls_* files or an API key.
    tls: bool = False
    tls_ca: Path | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_server_name: str | None = None
    api_key: SecretStr | None = None

    @model_validator(mode="after")
    def _consistent(self) -> TemporalSettings:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("tls_cert and tls_key go together (mTLS)")
        for name in ("tls_ca", "tls_cert", "tls_key"):
            path: Path | None = getattr(self, name)
            if path is not None and not path.is_file():
                raise ValueError(f"{name}: {path} is not a readable file")
        return self

    @property
    def uses_tls(self) -> bool:
        return self.tls or any((self.tls_ca, self.tls_cert, self.api_key))

    def tls_config(self) -> TLSConfig | bool:
        if not self.uses_tls:
            return False
        return TLSConfig(
            server_root_ca_cert=self.tls_ca.read_bytes() if self.tls_ca else None,
            client_cert=self.tls_cert.read_bytes() if self.tls_cert else None,
            client_private_key=self.tls_key.read_bytes() if self.tls_key else None,
            domain=self.tls_server_name,
        )

    def describe(self) -> str:
        """For logs: never the key."""
        extras = ["mTLS" if self.tls_cert else "TLS"] if self.uses_tls else []
        extras += ["API key"] if self.api_key else []
        suffix = f" ({', '.join(extras)})" if extras else ""
        return f"{self.address}/{self.namespace}{suffix}"


def load_temporal_settings(
    flags: Mapping[str, Any],
    environ: Mapping[str, str] | None = None,
    config_file: Path | None = None,
) -> TemporalSettings:
    """Merge the sources; ``flags`` holds only the flags actually given."""
    environ = os.environ if environ is None else environ
    config_file = config_file or _path_or_none(environ.get("TIMESHARE_CONFIG"))
    merged: dict[str, Any] = dict(_config_table(config_file)) if config_file else {}
    merged.update({k: environ[v] for k, v in ENVIRONMENT.items() if environ.get(v)})
    merged.update({k: v for k, v in flags.items() if v is not None})
    try:
        return TemporalSettings.model_validate(merged)
    except ValidationError as error:
        raise SettingsError(_problems(error)) from None


def _config_table(path: Path) -> Mapping[str, Any]:
    try:
        data = read_toml(path, "config file")
    except TomlFileError as error:
        raise SettingsError(str(error)) from None
    table = data.get("temporal", {})
    if not isinstance(table, dict):
        raise SettingsError(f"config file {path}: [temporal] must be a table")
    return table


def _problems(error: ValidationError) -> str:
    lines = []
    for problem in error.errors():
        where = ".".join(str(part) for part in problem["loc"])
        message = str(problem["msg"]).removeprefix("Value error, ")
        lines.append(f"temporal.{where}: {message}" if where else f"temporal: {message}")
    return "; ".join(lines)


def _path_or_none(value: str | None) -> Path | None:
    return Path(value) if value else None
