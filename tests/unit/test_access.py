"""The gateway's tokens file: a bad one is refused at start, naming the
field at fault. The rest of who may do what (job tokens, bearer tokens, TLS
and mTLS, the group limit) against a gateway: tests/integration/test_access.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from timeshare.workers.common.service import StartupError
from timeshare.workers.gateway.access import GatewaySecurity


@pytest.mark.parametrize(
    "content, problem",
    [
        ("tokens = []", "tokens"),
        ('[[tokens]]\nname = "x"\ngroups = ["*"]', "exactly one of token and sha256"),
        ('[[tokens]]\nname = "x"\ntoken = "short"\ngroups = ["*"]', "at least 16"),
        ('[[tokens]]\nname = "x"\nsha256 = "zz"\ngroups = ["*"]', "64 hex digits"),
        ("not toml at all [", "not valid TOML"),
    ],
)
def test_a_bad_tokens_file_is_refused_with_the_field(
    tmp_path: Path, content: str, problem: str
) -> None:
    path = tmp_path / "tokens.toml"
    path.write_text(content)
    security = GatewaySecurity(listen="127.0.0.1:1", tokens_file=path)
    with pytest.raises(StartupError, match=problem):
        security.access()
