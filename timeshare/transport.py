"""How a client reaches the gateway: plain text on this host, or TLS (and a
client certificate for mTLS) and a bearer token where the gateway asks."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from timeshare.errors import InvalidArgument


@dataclass(frozen=True)
class Transport:
    """Channel settings; every field falls back to its environment variable."""

    token: str | None = None  # TIMESHARE_TOKEN
    tls_ca: Path | None = None  # TIMESHARE_TLS_CA (implies TLS)
    tls_cert: Path | None = None  # TIMESHARE_TLS_CERT, with TIMESHARE_TLS_KEY (mTLS)
    tls_key: Path | None = None
    tls: bool = False  # TIMESHARE_TLS=1: TLS with the system's roots
    metadata: tuple[tuple[str, str], ...] = field(default=(), init=False)

    @classmethod
    def resolve(
        cls,
        token: str | None = None,
        tls_ca: str | Path | None = None,
        tls_cert: str | Path | None = None,
        tls_key: str | Path | None = None,
    ) -> Transport:
        env = os.environ
        transport = cls(
            token=token or env.get("TIMESHARE_TOKEN") or None,
            tls_ca=_path(tls_ca or env.get("TIMESHARE_TLS_CA")),
            tls_cert=_path(tls_cert or env.get("TIMESHARE_TLS_CERT")),
            tls_key=_path(tls_key or env.get("TIMESHARE_TLS_KEY")),
            tls=env.get("TIMESHARE_TLS", "") not in ("", "0", "false"),
        )
        if (transport.tls_cert is None) != (transport.tls_key is None):
            raise InvalidArgument("tls_cert and tls_key go together (TIMESHARE_TLS_CERT/_KEY)")
        if transport.token:
            metadata = (("authorization", f"Bearer {transport.token}"),)
            object.__setattr__(transport, "metadata", metadata)
        return transport

    @property
    def secure(self) -> bool:
        return self.tls or self.tls_ca is not None or self.tls_cert is not None

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=_read(self.tls_ca),
            private_key=_read(self.tls_key),
            certificate_chain=_read(self.tls_cert),
        )

    def channel(self, address: str) -> grpc.Channel:
        if self.secure:
            return grpc.secure_channel(address, self.credentials(), CHANNEL_OPTIONS)
        return grpc.insecure_channel(address, CHANNEL_OPTIONS)

    def aio_channel(self, address: str) -> grpc.aio.Channel:
        if self.secure:
            return grpc.aio.secure_channel(address, self.credentials(), CHANNEL_OPTIONS)
        return grpc.aio.insecure_channel(address, CHANNEL_OPTIONS)


# gRPC shares a process's connections to one address among its channels, so
# a connection made afresh after an outage would inherit the back-off of an
# older client's refused attempts and fail at once; each channel keeps its own.
CHANNEL_OPTIONS = (("grpc.use_local_subchannel_pool", 1),)


def _path(value: str | Path | None) -> Path | None:
    return Path(value) if value else None


def _read(path: Path | None) -> bytes | None:
    if path is None:
        return None
    try:
        return path.read_bytes()
    except OSError as error:
        raise InvalidArgument(f"cannot read {path}: {error.strerror}") from None
