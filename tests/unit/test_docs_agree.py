"""Pages that must agree with each other and with the code: where two pages
said different things (the agent's registrations, an idle member's lease,
the extras of the cuda backend, the reliability claim), where a page left
out what another has (the policy table, the README's verl line), and the
shape a new user finds their way by (a short getting-started, a glossary
every page links, an examples index)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.doc_blocks.markdown import REPO, all_blocks
from timeshare.models import GroupPolicy
from timeshare.workers.agent.serve import registrations_path

DOCS = REPO / "docs"
PAGES = sorted(DOCS.rglob("*.md"))
SLURM = REPO / "deploy" / "slurm"


def text(path: Path) -> str:
    return path.read_text()


def test_every_group_policy_field_is_in_the_policy_table() -> None:
    table = text(DOCS / "guide" / "policies.md")
    missing = [name for name in GroupPolicy.model_fields if f"| `{name}` |" not in table]
    assert missing == []


def test_the_cuda_backend_is_installed_with_the_server_extra_on_every_page() -> None:
    """The cuda backend runs in the node agent, a server process: one page
    said `timeshare[cuda]`, another `timeshare[server,cuda]`."""
    pages = [REPO / "README.md", *PAGES, SLURM / "README.md"]
    found = [
        f"{page.relative_to(REPO)}: {extras}"
        for page in pages
        for extras in re.findall(r"timeshare\[([^\]]*)\]", text(page))
        if "cuda" in extras.split(",") and "server" not in extras.split(",")
    ]
    assert found == []


def test_every_page_says_the_agent_keeps_registrations_in_a_file_beside_its_socket() -> None:
    """deploy/slurm/README.md said "in memory"; docs/operations.md "in a file"."""
    name = registrations_path("/run/timeshare/agent.sock").name
    for page in (SLURM / "README.md", DOCS / "operations.md"):
        assert name in text(page), page
        assert "registrations in memory" not in text(page), page


def test_the_slurm_epilog_gives_an_idle_members_lease_as_the_policy_does() -> None:
    """Its text spoke of a 30 s lease; a member that holds nothing waits out
    idle_lease_seconds (an hour), which is what the epilog saves."""
    assert GroupPolicy().idle_lease_seconds == 3600
    for page in (SLURM / "README.md", SLURM / "epilog.sh"):
        words = text(page)
        assert "idle_lease_seconds" in words and "an hour" in words, page
        assert "lease (30 s" not in words, page


def test_the_readme_and_reliability_agree_that_a_stuck_group_heals_by_itself() -> None:
    """The README once said killing any part loses no request while
    reliability.md kept a group stuck until a person ended it."""
    readme = " ".join(text(REPO / "README.md").split())
    reliability = text(DOCS / "reliability.md")
    assert "no request was lost" in readme and "heals by itself" in readme
    assert "## A group that cannot be replayed" in reliability
    assert "temporal workflow terminate" not in reliability


def test_the_readmes_verl_line_sets_what_the_integrations_page_sets() -> None:
    """The README left out the `env_vars` lines that name the job to Ray's workers."""

    def verl_settings(page: Path) -> set[str]:
        blocks = [b.text for b in all_blocks() if b.path == page and "verl.trainer" in b.text]
        assert blocks, page
        return set(re.findall(r"\+ray_kwargs\.\S+", " ".join(blocks)))

    integrations = verl_settings(DOCS / "integrations.md")
    assert any("env_vars.TIMESHARE_JOB" in setting for setting in integrations)
    assert verl_settings(REPO / "README.md") == integrations


def test_getting_started_is_short() -> None:
    assert len(text(DOCS / "getting-started.md").splitlines()) < 150


def test_the_user_guide_is_split_by_task() -> None:
    index = text(DOCS / "user-guide.md")
    guide = sorted((DOCS / "guide").glob("*.md"))
    assert len(index.splitlines()) < 100 and len(guide) >= 6
    for page in guide:
        assert f"guide/{page.name}" in index, page.name


@pytest.mark.parametrize(
    "page", [p for p in PAGES if p.name != "glossary.md"], ids=lambda p: p.name
)
def test_every_page_links_the_glossary(page: Path) -> None:
    assert "glossary.md" in text(page)


def test_the_glossary_defines_the_words_the_pages_used_before_explaining_them() -> None:
    glossary = text(DOCS / "glossary.md")
    for word in ("hand-over", "snapshot backend", "quiesce", "GPU set", "co-residency"):
        assert word in glossary, word


def test_the_examples_index_names_every_example_and_what_it_needs() -> None:
    index = text(REPO / "examples" / "README.md")
    examples = [p.name for p in (REPO / "examples").iterdir() if p.is_dir() and p.name[0] != "_"]
    assert examples and all(f"`{name}" in index for name in examples), examples
    assert "trl==" in index and "numpy" in index
