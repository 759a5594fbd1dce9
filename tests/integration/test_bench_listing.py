"""`python -m bench`: one benchmark per module at bench/'s top level, each
listed with what it measures; an unknown name gets one line and exit 2."""

from __future__ import annotations

import ast
import subprocess
import sys

from bench.__main__ import HERE, names
from tests.conftest import REPO


def bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bench", *args], cwd=REPO, capture_output=True, text=True
    )


def test_the_list_has_one_line_per_benchmark_saying_what_it_measures() -> None:
    result = bench("--list")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert [line.split()[0] for line in lines] == names()
    for line in lines:
        what = line.split(maxsplit=1)[1]
        assert what.endswith(".") and len(what.split()) >= 5, line


def test_every_listed_module_is_a_benchmark_with_a_main() -> None:
    for name in names():
        tree = ast.parse((HERE / f"{name}.py").read_text())
        functions = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
        assert "main" in functions, f"bench/{name}.py is listed but has no main()"


def test_an_unknown_benchmark_gets_one_line_naming_the_choices() -> None:
    result = bench("no_such_benchmark")
    assert result.returncode == 2
    assert result.stdout == ""
    [line] = result.stderr.splitlines()
    assert "'no_such_benchmark'" in line
    assert all(name in line for name in names())


def test_a_benchmark_gets_its_own_arguments_under_the_command_run() -> None:
    result = bench("handover", "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: python -m bench handover ")


def test_the_benchmark_results_stay_a_page_a_user_reads() -> None:
    """docs/benchmarks.md holds results, commands and machines (under
    500 lines); the diary of how they came about is in git history."""
    lines = (REPO / "docs" / "benchmarks.md").read_text().splitlines()
    assert len(lines) < 500, f"docs/benchmarks.md has {len(lines)} lines"
