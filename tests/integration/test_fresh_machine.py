"""The suite as a new machine runs it: no per-user cache that an earlier run
left behind may be what makes a test pass.

- .ci/run points every per-user cache at a new empty folder for its run and
  keeps pip's configuration (checked with a stand-in `make` that records
  what it was given);
- the unit tests pass with those caches empty (matplotlib, for one, lists the
  system's fonts with a process the first time it draws, which the unit
  tests' guard refuses)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.conftest import REPO

CACHES = ("XDG_CACHE_HOME", "MPLCONFIGDIR", "TORCH_HOME", "HF_HOME", "PIP_CACHE_DIR")
# Where pip finds its configuration, and so the package index.
KEPT = ("HOME", "XDG_CONFIG_HOME", "XDG_CONFIG_DIRS", "PIP_CONFIG_FILE")

RECORDING_MAKE = """#!/usr/bin/env python3
import json, os, sys
from pathlib import Path
caches = {}
for name in %(caches)r:
    value = os.environ.get(name)
    folder = Path(value) if value else None
    caches[name] = {"path": value,
                    "empty": folder is None or not folder.exists() or not any(folder.iterdir())}
with open(%(log)r, "a") as log:
    log.write(json.dumps({"argv": sys.argv[1:], "caches": caches,
                          "kept": {name: os.environ.get(name) for name in %(kept)r}}) + "\\n")
"""


def run_ci_with_recording_make(tmp_path: Path, log: Path) -> subprocess.CompletedProcess[str]:
    tmp_path = Path(tempfile.mkdtemp(dir=tmp_path))
    clone = tmp_path / "clone"
    (clone / ".ci").mkdir(parents=True)
    (clone / ".ci" / "run").write_text((REPO / ".ci" / "run").read_text())
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    make = bin_dir / "make"
    make.write_text(RECORDING_MAKE % {"caches": CACHES, "log": str(log), "kept": KEPT})
    make.chmod(make.stat().st_mode | stat.S_IEXEC)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "CI": "true"}
    for name in CACHES:
        env.pop(name, None)
    return subprocess.run(["bash", str(clone / ".ci" / "run")], env=env, capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL)  # fmt: skip


def test_ci_runs_the_suite_with_new_empty_caches_and_pips_configuration(tmp_path: Path) -> None:
    log = tmp_path / "make.jsonl"
    first = run_ci_with_recording_make(tmp_path, log)
    assert first.returncode == 0, first.stderr
    second = run_ci_with_recording_make(tmp_path, log)
    assert second.returncode == 0, second.stderr
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert [call["argv"] for call in calls] == [["test"], ["lint"]] * 2
    home = Path.home().resolve()
    for call in calls:
        for name, cache in call["caches"].items():
            assert cache["path"], f".ci/run leaves {name} unset (the home folder's cache)"
            assert home not in Path(cache["path"]).resolve().parents, (name, cache)
            assert cache["empty"], f"{name} is not empty when the suite starts: {cache}"
        assert call["kept"] == {name: os.environ.get(name) for name in KEPT}
    # A new folder for every run, removed when it ends.
    paths = [call["caches"]["XDG_CACHE_HOME"]["path"] for call in calls]
    assert paths[0] == paths[1] != paths[2] == paths[3]
    assert not Path(paths[0]).exists() and not Path(paths[2]).exists()


def test_the_unit_tests_pass_with_empty_per_user_caches(tmp_path: Path) -> None:
    env = dict(os.environ)
    for name in CACHES:
        env[name] = str(tmp_path / name.lower())
    # Less the property machines (a minute of random steps through pure cores,
    # which draw nothing and load no library that keeps a cache; the suite
    # runs them).
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider",
         "-k", "not Machine and not machine_finds", "tests/unit"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
