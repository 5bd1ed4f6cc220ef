"""The documents a newcomer reads hold together: every relative link in README.md,
BENCHMARKS.md and docs/*.md points to a file of the repository (and, with a ``#``, to a
heading of it), and none leads outside the repository."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = sorted([ROOT / "README.md", ROOT / "BENCHMARKS.md", *(ROOT / "docs").glob("*.md")])
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def links(document: Path) -> list[str]:
    """The targets of the markdown links of ``document``, outside code blocks."""
    return LINK.findall(FENCE.sub("", document.read_text()))


def anchors(document: Path) -> set[str]:
    """The anchors of the headings of ``document``, as GitHub makes them."""
    headings = re.findall(r"^#{1,6} (.+)$", FENCE.sub("", document.read_text()), re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def test_the_documents_exist() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in DOCUMENTS}
    assert {
        "README.md",
        "BENCHMARKS.md",
        "docs/design.md",
        "docs/reconfiguration.md",
        "docs/operations.md",
        "docs/spark.md",
    } <= names


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_resolve_inside_the_repository(document: Path) -> None:
    broken = []
    for target in links(document):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        file = (document.parent / path).resolve() if path else document
        if not file.is_relative_to(ROOT):
            broken.append(f"{target}: outside the repository")
        elif not file.is_file():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target}: no heading #{anchor} in {file.name}")
    assert not broken, f"{document.name}: {broken}"


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_document_points_outside_the_repository(document: Path) -> None:
    text = document.read_text()
    assert "../shared" not in text
    assert "DESIGN.md" not in text
