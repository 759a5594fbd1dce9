"""The documentation's blocks marked to run, run: each page's in order, in a
scratch folder that looks like a clone's root to them (`.venv` and
`examples/` linked in), those marked "with a stack" against one LocalStack
(TIMESHARE_ADDRESS and TIMESHARE_AGENT_SOCKET set, a group `grpo-pair`
already there, as the pages assume). tests/unit/test_docs_blocks.py checks
that every block is run here or marked with why not."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import timeshare
from tests.doc_blocks.markdown import REPO, Block, all_blocks
from timeshare.testing import LocalStack

RUN_SECONDS = 180
# A group the pages' examples name, made before they run.
EXAMPLE_GROUP = "grpo-pair"
RUN_BLOCKS = [block for block in all_blocks() if block.marker is not None and block.marker.run]
PAGES = sorted({block.path for block in RUN_BLOCKS})


@pytest.fixture(scope="module")
def docs_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    with LocalStack(tmp_path_factory.mktemp("docs-stack"), state_gib=0.25) as stack:
        with timeshare.connect(stack.address) as client:
            job = client.join(EXAMPLE_GROUP, "example", nodes=[stack.node])
            with job.turn(timeout=60):
                pass
            job.leave()
        yield stack


def scratch_clone(folder: Path) -> Path:
    """A folder whose `.venv` and `examples/` are this checkout's."""
    (folder / ".venv").symlink_to(Path(sys.prefix))
    (folder / "examples").symlink_to(REPO / "examples")
    return folder


def environment(stack: LocalStack | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIMESHARE_")}
    env["PATH"] = f"{Path(sys.prefix) / 'bin'}:{env.get('PATH', '')}"
    if stack is not None:
        env["TIMESHARE_ADDRESS"] = stack.address
        env["TIMESHARE_AGENT_SOCKET"] = str(stack.socket_path)
    return env


def run_block(block: Block, folder: Path, stack: LocalStack | None) -> None:
    marker = block.marker
    assert marker is not None
    if marker.save_as:
        (folder / marker.save_as).write_text(block.text + "\n")
        return
    if block.kind == "python":
        script = folder / ("test_block.py" if marker.as_test else "block.py")
        script.write_text(block.text + "\n")
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(script)]
        if not marker.as_test:
            command = [sys.executable, str(script)]
    else:
        command = ["bash", "-e", "-o", "pipefail", "-c", block.text]
    done = subprocess.run(
        command, cwd=folder, env=environment(stack), capture_output=True, text=True,
        timeout=RUN_SECONDS,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 0 and "Traceback" not in output, f"{block.where}:\n{output[-3000:]}"


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(REPO)))
def test_the_blocks_a_page_marks_to_run_run(
    page: Path, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    blocks = [block for block in RUN_BLOCKS if block.path == page]
    needs_stack = any(block.marker is not None and block.marker.with_stack for block in blocks)
    stack: LocalStack | None = request.getfixturevalue("docs_stack") if needs_stack else None
    folder = scratch_clone(tmp_path)
    for block in blocks:
        assert block.marker is not None
        run_block(block, folder, stack if block.marker.with_stack else None)
