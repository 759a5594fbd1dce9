"""Temporal connection settings: flags over environment over config file,
and one line naming every bad field."""

from __future__ import annotations

from pathlib import Path

import pytest

from timeshare.workers.temporal_settings import SettingsError, load_temporal_settings


def test_flags_beat_environment_beat_config_file(tmp_path: Path) -> None:
    config = tmp_path / "timeshare.toml"
    config.write_text('[temporal]\naddress = "file:7233"\nnamespace = "from-file"\ntls = true\n')
    environ = {"TIMESHARE_TEMPORAL": "env:7233", "TIMESHARE_CONFIG": str(config)}
    settings = load_temporal_settings({"address": None}, environ)
    assert (settings.address, settings.namespace, settings.tls) == ("env:7233", "from-file", True)
    settings = load_temporal_settings({"address": "flag:7233"}, environ)
    assert settings.address == "flag:7233"
    assert load_temporal_settings({}, {}).address == "localhost:7233"


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
        {"TIMESHARE_TEMPORAL_API_KEY": "secret-key"},
    )
    tls = settings.tls_config()
    assert not isinstance(tls, bool)
    assert tls.server_root_ca_cert == b"-- ca.pem --"
    assert tls.client_cert == b"-- client.pem --" and tls.domain == "temporal.internal"
    assert "secret-key" not in settings.describe() and "mTLS" in settings.describe()
    assert "secret-key" not in repr(settings)
    assert load_temporal_settings({}, {}).tls_config() is False


def test_every_bad_field_is_named_on_one_line(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text('[temporal]\naddress = "no-port"\nnamespace = ""\ncolour = "blue"\n')
    with pytest.raises(SettingsError) as refused:
        load_temporal_settings({}, {}, config)
    message = str(refused.value)
    assert "\n" not in message
    for field in ("temporal.address", "temporal.namespace", "temporal.colour"):
        assert field in message
