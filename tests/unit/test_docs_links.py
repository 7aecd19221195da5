"""The README and docs/ link only to files inside the repository, and they exist.

A user's clone has nothing beside the repository, so a link to a file outside it (such as
design notes kept next to the checkout) or to a file that was renamed is a dead end. Links to
web pages are not checked (no network here); relative links and their ``#anchors`` are.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

#: ``[text](target)`` and ``![alt](target)``, the target up to a space or ")".
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)


def _links(text: str) -> list[str]:
    """Relative link targets outside code blocks and code spans."""
    text = _FENCE.sub("", text)
    text = re.sub(r"`[^`\n]*`", "", text)
    return [t for t in _LINK.findall(text) if not re.match(r"^[a-z][a-z0-9+.-]*:", t)]


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`|\*\*|\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = _FENCE.sub("", path.read_text())
    return {_slug(h) for h in _HEADING.findall(text)}


def test_the_link_finder_sees_links_and_skips_code() -> None:
    text = (
        "See [a](docs/a.md#x-y), ![img](pic.png) and [web](https://example.com).\n"
        "`[not](code.md)`\n```\n[nor](block.md)\n```\n"
    )
    assert _links(text) == ["docs/a.md#x-y", "pic.png"]
    assert _slug("4. Record batches: the unit of everything") == (
        "4-record-batches-the-unit-of-everything"
    )
    assert _slug("The `strom` command") == "the-strom-command"


def test_the_docs_exist() -> None:
    names = {p.name for p in DOCS}
    assert {"README.md", "architecture.md", "design.md"} <= names


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_point_to_files_in_the_repository(doc: Path) -> None:
    problems = []
    for target in _links(doc.read_text()):
        path_part, _, anchor = target.partition("#")
        dest = (doc.parent / path_part).resolve() if path_part else doc
        if not dest.is_relative_to(ROOT):
            problems.append(f"{target}: outside the repository")
        elif not dest.exists():
            problems.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            problems.append(f"{target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert not problems, f"{doc.relative_to(ROOT)}: " + "; ".join(problems)


def _repository_files() -> list[Path]:
    try:
        out = subprocess.run(
            ["git", "ls-files", "-co", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        return [ROOT / line for line in out.splitlines() if line]
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: walk the tree
        skip = {".git", ".venv", "node_modules", "__pycache__", ".ruff_cache", ".pytest_cache"}
        return [
            p for p in ROOT.rglob("*") if p.is_file() and not skip & set(p.relative_to(ROOT).parts)
        ]


def test_no_file_refers_to_the_design_notes_outside_the_repository() -> None:
    # Spelled in pieces so that this file does not match itself.
    needles = ["../" + "shared", "/work/" + "shared", "DESIGN" + ".md"]
    found = []
    for path in _repository_files():
        if not path.is_file() or "node_modules" in path.parts:
            continue
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue  # binary files
        for needle in needles:
            if needle in text:
                found.append(f"{path.relative_to(ROOT)} mentions {needle}")
    assert not found, "; ".join(found)
