"""Who may reach the gateway and what each caller may do.

Three layers, each optional on loopback and required elsewhere:
TLS (server certificate), client certificates (mTLS, any certificate the
given CA signed), and bearer tokens from a tokens file, each scoped to the
groups it may use. Job tokens from Join are checked by the group workflow,
not here.
"""

from __future__ import annotations

import fnmatch
import hashlib
import hmac
import ipaddress
import sys
from pathlib import Path
from typing import Any

import grpc
from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from timeshare.workers.common.service import StartupError
from timeshare.workers.gateway.errors import AccessDenied
from timeshare.workers.gateway.toml_file import TomlFileError, read_toml

Context = grpc.aio.ServicerContext[Any, Any]
BEARER = "bearer "


class ScopedToken(BaseModel):
    """One entry of the tokens file."""

    name: str = Field(min_length=1, max_length=128)
    # The token itself, or (better: the file then holds no secret) its SHA-256 in hex.
    token: str = ""
    sha256: str = ""
    # Shell-style patterns of the groups this token may use; "*" for all.
    groups: list[str] = Field(min_length=1)
    # Operator calls: evict, pause and drain (drain reaches every group, so it
    # needs "*" in groups too).
    operator: bool = False

    @model_validator(mode="after")
    def _one_secret(self) -> ScopedToken:
        if bool(self.token) == bool(self.sha256):
            raise ValueError("give exactly one of token and sha256")
        if self.token and len(self.token) < 16:
            raise ValueError("token: use at least 16 characters")
        if self.sha256 and (len(self.sha256) != 64 or not _is_hex(self.sha256)):
            raise ValueError("sha256: 64 hex digits")
        return self

    @property
    def digest(self) -> str:
        return self.sha256.lower() or sha256_hex(self.token)

    def allows(self, group: str) -> bool:
        return any(fnmatch.fnmatchcase(group, pattern) for pattern in self.groups)


class TokensFile(BaseModel):
    tokens: list[ScopedToken] = Field(min_length=1)

    @field_validator("tokens")
    @classmethod
    def _unique(cls, tokens: list[ScopedToken]) -> list[ScopedToken]:
        digests = [t.digest for t in tokens]
        if len(set(digests)) != len(digests):
            raise ValueError("the same token appears twice")
        return tokens


class GatewaySecurity(BaseModel):
    """The gateway's transport and caller settings, from its flags."""

    listen: str
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_client_ca: Path | None = None
    tokens_file: Path | None = None
    insecure: bool = False

    @model_validator(mode="after")
    def _consistent(self) -> GatewaySecurity:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("--tls-cert and --tls-key go together")
        if self.tls_client_ca is not None and self.tls_cert is None:
            raise ValueError("--tls-client-ca needs --tls-cert and --tls-key")
        if self.insecure and self.tls_cert is not None:
            raise ValueError("--insecure and --tls-cert contradict each other")
        return self

    @property
    def loopback_only(self) -> bool:
        host = self.listen.rpartition(":")[0].strip("[]")
        if host == "localhost":
            return True
        try:
            return ipaddress.ip_address(host).is_loopback
        except ValueError:
            return False

    def check(self) -> None:
        """Refuse to serve beyond this host without TLS and caller checks."""
        if self.loopback_only or self.insecure:
            return
        if self.tls_cert is None:
            raise StartupError(
                f"--listen {self.listen} is reachable from other hosts: give --tls-cert and "
                "--tls-key (and --tls-client-ca or --tokens-file), or listen on 127.0.0.1"
            )
        if self.tls_client_ca is None and self.tokens_file is None:
            raise StartupError(
                f"--listen {self.listen} with TLS still admits anyone: give --tls-client-ca "
                "(client certificates) or --tokens-file (bearer tokens)"
            )

    def warn_if_insecure(self) -> None:
        if self.insecure and not self.loopback_only:
            print(
                f"timeshare gateway: WARNING: --insecure: {self.listen} serves plain-text gRPC "
                "to anyone who can reach it, with no caller checks: for tests, or llm-d "
                "clients on a network you trust (limit them with --llmd-compat-allow).",
                file=sys.stderr,
                flush=True,
            )

    def server_credentials(self) -> grpc.ServerCredentials | None:
        if self.tls_cert is None or self.tls_key is None:
            return None
        client_ca = _read(self.tls_client_ca) if self.tls_client_ca else None
        return grpc.ssl_server_credentials(
            [(_read(self.tls_key), _read(self.tls_cert))],
            root_certificates=client_ca,
            require_client_auth=client_ca is not None,
        )

    def access(self) -> Access:
        return Access(load_tokens(self.tokens_file) if self.tokens_file else None)


class Access:
    """Checks a caller's bearer token against the tokens file, if there is one."""

    def __init__(self, tokens: TokensFile | None) -> None:
        self._tokens = tokens

    @property
    def enforced(self) -> bool:
        return self._tokens is not None

    def caller(self, context: Context) -> ScopedToken | None:
        """The caller's token entry; None when no tokens file is configured."""
        if self._tokens is None:
            return None
        presented = _bearer(context)
        if presented is None:
            raise AccessDenied(
                grpc.StatusCode.UNAUTHENTICATED,
                "this gateway needs a bearer token: set TIMESHARE_TOKEN "
                "(metadata 'authorization: Bearer <token>')",
            )
        digest = sha256_hex(presented)
        for entry in self._tokens.tokens:
            if hmac.compare_digest(entry.digest, digest):
                return entry
        raise AccessDenied(grpc.StatusCode.UNAUTHENTICATED, "the bearer token is not known here")

    def require(self, context: Context, group: str | None, operator: bool = False) -> None:
        """``group=None``: a call that reaches every group (drain) needs groups = ["*"]."""
        entry = self.caller(context)
        if entry is None:
            return
        if operator and not entry.operator:
            raise AccessDenied(
                grpc.StatusCode.PERMISSION_DENIED,
                f"token {entry.name!r} may not make operator calls (operator = true)",
            )
        allowed = "*" in entry.groups if group is None else entry.allows(group)
        if not allowed:
            raise AccessDenied(
                grpc.StatusCode.PERMISSION_DENIED,
                f"token {entry.name!r} may not use "
                + ("every group" if group is None else f"group {group!r}"),
            )

    def visible(self, context: Context, groups: list[str]) -> list[str]:
        entry = self.caller(context)
        return groups if entry is None else [g for g in groups if entry.allows(g)]


def load_tokens(path: Path) -> TokensFile:
    try:
        data = read_toml(path, "--tokens-file")
    except TomlFileError as error:
        raise StartupError(str(error)) from None
    try:
        return TokensFile.model_validate(data)
    except ValidationError as error:
        raise StartupError(f"--tokens-file {path}: {first_problem(error)}") from None


def first_problem(error: ValidationError) -> str:
    problem = error.errors()[0]
    where = ".".join(str(part) for part in problem["loc"])
    return f"{where}: {problem['msg']}" if where else str(problem["msg"])


def sha256_hex(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _bearer(context: Context) -> str | None:
    for key, value in context.invocation_metadata() or ():
        if key == "authorization" and isinstance(value, str) and value.lower().startswith(BEARER):
            return value[len(BEARER) :].strip() or None
    return None


def _is_hex(text: str) -> bool:
    return all(c in "0123456789abcdefABCDEF" for c in text)


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as error:
        raise StartupError(f"cannot read {path}: {error.strerror}") from None
