"""The README a newcomer reads in five minutes (issue 66): short, the quick start on its first screen, the two
quick-start commands runnable in a new shell, and every page it or docs/ links to present."""

from __future__ import annotations

import re

import pytest

from conftest import ROOT

PAGES = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")),
         *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "trainers").glob("*/README.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but hyphens and underscores dropped, spaces to
    hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {slug(m.group(1)) for m in re.finditer(r"^#+\s+(.*)$", text, re.M)}


def test_the_readme_is_short_with_the_quick_start_on_its_first_screen():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 250, len(lines)
    quick = next(i for i, line in enumerate(lines) if line.startswith("## Quick start"))
    assert quick < 60, quick
    for heading in ("## Deploy on a GPU box", "## The five trainers", "## Commands", "## Where to read more",
                    "## Dive into the code"):
        assert heading in lines, heading
    assert not re.search(r"\b[0-9a-f]{7,40}\b(?![^<]*-->)", "\n".join(lines[:quick]))  # no commit in the opening


def test_the_quick_starts_commands_run_in_a_new_shell():
    """The second command activates the venv itself: a new shell has none (it installed into the system Python
    once), and the first upgrades pip before the install (23.2 backtracked for 17 minutes)."""
    text = (ROOT / "README.md").read_text()
    quick = text[text.index("## Quick start"):text.index("## Deploy on a GPU box")]
    first, second = re.findall(r"```bash\n(.*?)\n```", quick, re.S)[:2]
    assert first.startswith("python3 -m venv .venv && . .venv/bin/activate && pip install --upgrade pip && ")
    assert "deploy_8gpu.sh --demo --out runs" in first
    assert second.startswith(". .venv/bin/activate && ") and second.endswith("python -m pytest -q")
    assert "status --out runs" in quick  # where `status` finds the demo: it defaults to --out output


def test_the_readme_test_command_is_what_ci_runs():
    assert "python -m pytest -q" in (ROOT / ".ci" / "run").read_text()


@pytest.mark.parametrize("page", PAGES)
def test_every_relative_link_points_at_something_that_exists(page):
    path = ROOT / page
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    missing = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            missing.append(target)
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            missing.append(target)
    assert not missing, f"{page}: {missing}"
