"""The documentation checked by the suite, without running anything: every
fenced shell and Python block of README.md, docs/ and examples/ is marked as
run (tests/integration/test_docs_commands.py runs those) or not run with a
reason; each one's timeshare commands, flags, modules, make targets and pip
installs exist; each Python block compiles and calls timeshare's names with
arguments they take; commands quoted in prose and links between pages hold
too. And the checks themselves catch what they are for."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.doc_blocks.checks import block_problems
from tests.doc_blocks.inline import inline_commands, inline_problems
from tests.doc_blocks.links import link_problems
from tests.doc_blocks.markdown import REPO, Block, all_blocks, blocks_of, documentation_files

BLOCKS = [block for block in all_blocks() if block.kind != "other" or block.lang in ("", "text")]
PAGES = documentation_files()


@pytest.mark.parametrize("block", BLOCKS, ids=lambda block: block.where)
def test_every_block_is_run_or_marked_and_names_only_what_exists(block: Block) -> None:
    assert block_problems(block) == []


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(REPO)))
def test_every_command_quoted_in_prose_exists(page: Path) -> None:
    found = {
        f"line {line}: {span}": problems
        for line, span in inline_commands(page)
        if (problems := inline_problems(span))
    }
    assert found == {}


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(REPO)))
def test_every_link_between_pages_lands(page: Path) -> None:
    assert link_problems(page) == []


def test_the_pages_are_there_and_many_blocks_are_checked() -> None:
    names = {str(page.relative_to(REPO)) for page in PAGES}
    assert {"README.md", "docs/getting-started.md", "examples/README.md"} <= names
    assert sum(1 for block in BLOCKS if block.kind == "shell") > 30
    assert sum(1 for block in BLOCKS if block.kind == "python") > 15


def page_with(tmp_path: Path, text: str) -> list[Block]:
    page = tmp_path / "page.md"
    page.write_text(text)
    return blocks_of(page)


def test_a_new_unmarked_block_fails(tmp_path: Path) -> None:
    (block,) = page_with(tmp_path, "Run it:\n\n```sh\ntimeshare status\n```\n")
    assert any("neither run nor marked" in problem for problem in block_problems(block))
    (marked,) = page_with(tmp_path, "<!-- check: not run: gpu -->\n```sh\ntimeshare status\n```\n")
    assert block_problems(marked) == []
    (unlabelled,) = page_with(tmp_path, "```\ntimeshare status\n```\n")
    assert any("label it" in problem for problem in block_problems(unlabelled))


def test_a_reason_outside_the_list_or_a_missing_test_fails(tmp_path: Path) -> None:
    (vague,) = page_with(tmp_path, "<!-- check: not run: later -->\n```sh\nls\n```\n")
    assert any("REASON one of" in problem for problem in block_problems(vague))
    (gone,) = page_with(
        tmp_path, "<!-- check: not run: tested by tests/" + "no_such_test.py -->\n```sh\nls\n```\n"
    )
    assert any("not there" in problem for problem in block_problems(gone))


@pytest.mark.parametrize(
    "command, problem",
    [
        ("timeshare status --no-such-flag", "has no flag --no-such-flag"),
        ("timeshare no-such-command", "has no command"),
        ("python -m bench handover --no-such-flag", "has no flag --no-such-flag"),
        ("python -m bench no_such_bench", "has no benchmark"),
        ("python -m timeshare.integrations.coordinator --nope -- train", "has no flag --nope"),
        ("make no-such-target", "no target"),
        ("pip install ./timeshare", "holds no pyproject.toml"),
        ("pip install 'timeshare[no-such-extra]'", "has no extra"),
        (
            "timeshare gateway --llmd-compat --listen 0.0.0.0:50051 --llmd-compat-allow 10.0.0.0/8",
            "reachable from other hosts",
        ),
    ],
)
def test_a_documented_flag_or_command_that_disappears_fails(
    tmp_path: Path, command: str, problem: str
) -> None:
    (block,) = page_with(tmp_path, f"<!-- check: not run: gpu -->\n```sh\n{command}\n```\n")
    assert any(problem in found for found in block_problems(block)), block_problems(block)


@pytest.mark.parametrize(
    "code, problem",
    [
        ("from timeshare import no_such_name", "has no no_such_name"),
        ("import timeshare\ntimeshare.no_such_call()", "has no no_such_call"),
        ('import timeshare\ntimeshare.connect().join("g", "j", ["n"])', "too many positional"),
        ('import timeshare\njob = timeshare.connect().join("g", "j")\njob.turn(nope=1)', "nope"),
        ("import timeshare\nwith timeshare.connect().join('g', 'j').turn() as t:\n    t.nope",
         "Turn has no nope"),
        ("from timeshare.models import GroupPolicy\nGroupPolicy(no_such_field=1)", "no_such_field"),
        ("def broken(:\n    pass", "does not compile"),
    ],
)  # fmt: skip
def test_a_python_block_that_names_what_is_not_there_fails(
    tmp_path: Path, code: str, problem: str
) -> None:
    (block,) = page_with(tmp_path, f"<!-- check: not run: fragment -->\n```python\n{code}\n```\n")
    assert any(problem in found for found in block_problems(block)), block_problems(block)


def test_a_link_to_a_missing_page_or_heading_fails(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other\n\n## A section\n")
    page = tmp_path / "page.md"
    page.write_text("[ok](other.md#a-section) [gone](nowhere.md) [no](other.md#nothing)\n")
    assert link_problems(page) == [
        "nowhere.md: no such file",
        "other.md#nothing: other.md has no heading #nothing",
    ]


def test_a_message_quoted_in_prose_is_not_taken_for_a_command(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("It says `timeshare up: ready: ...`, then `timeshare evict --nope`.\n")
    assert [span for _, span in inline_commands(page)] == ["timeshare evict --nope"]
