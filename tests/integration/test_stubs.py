"""The committed gRPC stubs (timeshare/v1) are what `make proto` makes from the
.proto files today: a wheel built from any clean clone carries current stubs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROTOS = ["timeshare/v1/timeshare.proto", "timeshare/v1/llmd_compat.proto"]


def test_committed_stubs_match_the_proto(tmp_path: Path) -> None:
    plugin_dir = Path(sys.executable).parent
    if not (plugin_dir / "protoc-gen-mypy").exists():
        pytest.skip("mypy-protobuf is not installed (make install brings it)")
    command = [
        sys.executable, "-m", "grpc_tools.protoc", f"-I{ROOT / 'proto'}",
        f"--python_out={tmp_path}", f"--grpc_python_out={tmp_path}",
        f"--mypy_out={tmp_path}", f"--mypy_grpc_out={tmp_path}", *PROTOS,
    ]  # fmt: skip
    env_path = f"{plugin_dir}:{os.environ.get('PATH', '')}"
    subprocess.run(command, check=True, cwd=ROOT, env={"PATH": env_path})
    generated = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    committed = sorted(
        p.relative_to(ROOT) for p in (ROOT / "timeshare/v1").iterdir() if p.name != "__init__.py"
    )
    assert [str(p) for p in generated] == [
        str(p) for p in committed if p.suffix in (".py", ".pyi")
    ], "the set of stub files differs: run `make proto` and commit timeshare/v1"
    stale = [str(p) for p in generated if (tmp_path / p).read_bytes() != (ROOT / p).read_bytes()]
    assert not stale, f"stale stubs {stale}: run `make proto` and commit timeshare/v1"
