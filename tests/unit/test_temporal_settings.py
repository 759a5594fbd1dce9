"""Temporal connection settings through Temporal's own environment configuration:
flags over TEMPORAL_* variables over the config file's profile, the older
TIMESHARE_* variables as deprecated aliases, and one line for what is wrong;
and what a connection made with them sends."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from temporalio.api.workflowservice.v1 import GetSystemInfoResponse

from timeshare.workers.common.service import StartupError, connect_temporal
from timeshare.workers.common.temporal_settings import SettingsError, load_temporal_settings

PROFILES = """
[profile.default]
address = "file:7233"
namespace = "from-file"

[profile.prod]
address = "prod:7233"
namespace = "prod-ns"
api_key = "file-key"
"""


def test_flags_beat_environment_beat_the_config_file(tmp_path: Path) -> None:
    config = tmp_path / "temporal.toml"
    config.write_text(PROFILES)
    environ = {"TEMPORAL_ADDRESS": "env:7233", "TEMPORAL_CONFIG_FILE": str(config)}
    settings = load_temporal_settings({}, environ)
    assert (settings.address, settings.namespace) == ("env:7233", "from-file")
    settings = load_temporal_settings({"address": "flag:7233"}, environ)
    assert settings.address == "flag:7233"
    defaults = load_temporal_settings({}, {})
    assert (defaults.address, defaults.namespace, defaults.uses_tls) == (
        "localhost:7233",
        "default",
        False,
    )


def test_a_profile_is_chosen_by_flag_or_environment(tmp_path: Path) -> None:
    config = tmp_path / "temporal.toml"
    config.write_text(PROFILES)
    by_flag = load_temporal_settings({"config_file": config, "profile": "prod"}, {})
    by_env = load_temporal_settings({}, {"TEMPORAL_CONFIG_FILE": str(config),
                                         "TEMPORAL_PROFILE": "prod"})  # fmt: skip
    for settings in (by_flag, by_env):
        assert (settings.address, settings.namespace) == ("prod:7233", "prod-ns")
        # An API key implies TLS, as envconfig has it.
        assert settings.api_key is not None and settings.uses_tls
        assert "file-key" not in settings.describe() and "file-key" not in repr(settings)


def test_temporal_address_alone_points_at_a_server() -> None:
    settings = load_temporal_settings({}, {"TEMPORAL_ADDRESS": "temporal.internal:7233"})
    assert settings.address == "temporal.internal:7233"


def test_old_variables_still_work_with_a_deprecation_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    settings = load_temporal_settings(
        {}, {"TIMESHARE_TEMPORAL": "old:7233", "TIMESHARE_NAMESPACE": "old-ns"}
    )
    assert (settings.address, settings.namespace) == ("old:7233", "old-ns")
    err = capsys.readouterr().err
    assert "TIMESHARE_TEMPORAL is deprecated; set TEMPORAL_ADDRESS" in err
    assert "TIMESHARE_NAMESPACE is deprecated; set TEMPORAL_NAMESPACE" in err
    # The standard variable wins over the old one.
    both = load_temporal_settings({}, {"TIMESHARE_TEMPORAL": "old:1", "TEMPORAL_ADDRESS": "new:2"})
    assert both.address == "new:2"


def test_mtls_and_api_key_build_the_tls_config(tmp_path: Path) -> None:
    for name in ("ca.pem", "client.pem", "client.key"):
        (tmp_path / name).write_bytes(f"-- {name} --".encode())
    settings = load_temporal_settings(
        {
            "tls_ca": tmp_path / "ca.pem",
            "tls_cert": tmp_path / "client.pem",
            "tls_key": tmp_path / "client.key",
            "tls_server_name": "temporal.internal",
        },
        {"TEMPORAL_API_KEY": "secret-key"},
    )
    tls = settings.tls_config()
    assert not isinstance(tls, bool)
    assert tls.server_root_ca_cert == b"-- ca.pem --"
    assert tls.client_cert == b"-- client.pem --" and tls.domain == "temporal.internal"
    assert "secret-key" not in settings.describe() and "mTLS" in settings.describe()
    assert "secret-key" not in repr(settings) and "client.key" not in repr(settings)


@pytest.mark.parametrize(
    ("flags", "environ", "words"),
    [
        ({"address": "no-port"}, {}, ["temporal.address"]),
        ({"namespace": ""}, {}, ["temporal.namespace"]),
        ({"tls_cert": "/x.pem"}, {}, ["certificate and its key go together"]),
        ({"tls_ca": "/missing/ca.pem"}, {}, ["--temporal-tls-ca", "/missing/ca.pem"]),
        ({"profile": "nope"}, {}, ["Profile 'nope' not found"]),
        ({"config_file": "/missing.toml"}, {}, ["/missing.toml does not exist"]),
        ({}, {"TIMESHARE_CONFIG": "/etc/x.toml"}, ["TIMESHARE_CONFIG", "TEMPORAL_CONFIG_FILE"]),
    ],
)
def test_bad_settings_are_one_line(
    flags: dict[str, str], environ: dict[str, str], words: list[str]
) -> None:
    with pytest.raises(SettingsError) as refused:
        load_temporal_settings(flags, environ)
    message = str(refused.value)
    assert "\n" not in message
    for word in words:
        assert word in message


def test_unknown_keys_in_the_config_file_are_named(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text('[profile.default]\naddress = "a:1"\ncolour = "blue"\n')
    with pytest.raises(SettingsError) as refused:
        load_temporal_settings({"config_file": config}, {})
    assert "colour" in str(refused.value) and "\n" not in str(refused.value)


def test_compression_is_none_unless_asked(capsys: pytest.CaptureFixture[str]) -> None:
    assert load_temporal_settings({}, {}).compression == "none"
    by_env = load_temporal_settings({}, {"TIMESHARE_TEMPORAL_COMPRESSION": "gzip"})
    assert by_env.compression == "gzip"
    by_flag = load_temporal_settings(
        {"compression": "none"}, {"TIMESHARE_TEMPORAL_COMPRESSION": "gzip"}
    )
    assert by_flag.compression == "none"
    with pytest.raises(SettingsError) as refused:
        load_temporal_settings({"compression": "zstd"}, {})
    assert "--temporal-compression" in str(refused.value) and "'zstd'" in str(refused.value)


class IdentityOnlyFrontend(grpc.GenericRpcHandler):
    """Temporal's frontend as far as connecting goes (GetSystemInfo), on real
    gRPC over loopback: it records each call's metadata, and its server
    refuses compressed requests."""

    def __init__(self) -> None:
        self.metadata: list[dict[str, str | bytes]] = []

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler[bytes, bytes]:
        self.metadata.append(dict(details.invocation_metadata or ()))
        return grpc.unary_unary_rpc_method_handler(
            lambda request, context: GetSystemInfoResponse().SerializeToString()
        )


async def test_connections_send_the_metadata_and_compress_only_when_asked() -> None:
    """TEMPORAL_GRPC_META_* reach the server (they were read, then dropped);
    requests go uncompressed by default, gzip-compressed when asked."""
    frontend = IdentityOnlyFrontend()
    # Only the identity algorithm (bit 0): a gzip-compressed request is refused.
    server = grpc.aio.server(options=[("grpc.compression_enabled_algorithms_bitset", 1)])
    server.add_generic_rpc_handlers([frontend])
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        environ = {"TEMPORAL_ADDRESS": f"127.0.0.1:{port}", "TEMPORAL_GRPC_META_X_TEAM": "rl"}
        await connect_temporal(load_temporal_settings({}, environ))
        assert frontend.metadata[-1].get("x-team") == "rl", frontend.metadata
        gzip = load_temporal_settings({"compression": "gzip"}, environ)
        with pytest.raises(StartupError, match="'gzip' is disabled"):
            await connect_temporal(gzip)
    finally:
        await server.stop(None)
