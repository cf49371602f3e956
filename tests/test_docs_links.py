"""The README stays a document a person reads to the end, and no page links to a file that moved."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [
    ROOT / "README.md",
    ROOT / "bench" / "README.md",
    ROOT / "experiments" / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def local_targets(page: Path) -> list[str]:
    targets = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue  # a web address or an anchor on the same page
        targets.append(target.split("#")[0])
    return targets


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_names_a_file_that_exists(page):
    missing = [t for t in local_targets(page) if not (page.parent / t).exists()]
    assert not missing, f"{page.relative_to(ROOT)} links to missing files: {missing}"


def test_the_readme_is_read_to_the_end():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines; move measurements to docs/"


def test_the_readmes_results_open_with_what_improves_and_what_does_not():
    text = (ROOT / "README.md").read_text()
    results = text.split("\n## Results\n", 1)[1].lstrip()
    first = results.split("\n\n", 1)[0].lower()
    assert "improves" in first and "does not" in first, first
