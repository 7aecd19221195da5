"""The tests the reliability docs cite exist: found from outside, docs/reliability.md's
"Disk faults" section named ``test_disk_faults.py`` with no directory, and a reader looking
under tests/integration/ took the claims for unbacked. Every test file and test function
cited there must be found in the tests, and a section's heading names its file by path."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "reliability.md"
TESTS = ROOT / "tests"


def _test_files() -> dict[str, list[Path]]:
    """Every test module by its file name (several directories may hold one name)."""
    found: dict[str, list[Path]] = {}
    for path in TESTS.rglob("test_*.py"):
        if "node_modules" not in path.parts:
            found.setdefault(path.name, []).append(path)
    return found


def _cited(text: str) -> list[str]:
    """Each `...` span's words that name a test: files, file::function, or a function."""
    words = []
    for span in re.findall(r"`([^`]*)`", text):
        words += [w for w in re.split(r"[\s,]+", span) if "test_" in w]
    return words


def _missing(word: str, files: dict[str, list[Path]], defined: str) -> str | None:
    name, _, function = word.partition("::")
    if name.endswith(".py"):
        if "/" in name:
            if not (ROOT / name).is_file():
                return f"{name}: no such file"
            paths = [ROOT / name]
        else:
            paths = files.get(name, [])
            if not paths:
                return f"{name}: no such test file under tests/"
        if function and not any(f"def {function}(" in p.read_text() for p in paths):
            return f"{word}: no such test in {name}"
        return None
    if re.fullmatch(r"test_\w+", name) and f"def {name}(" not in defined:
        return f"{name}: no such test"
    return None


def test_every_test_the_reliability_doc_cites_exists() -> None:
    files = _test_files()
    defined = "\n".join(p.read_text() for paths in files.values() for p in paths)
    cited = _cited(DOC.read_text())
    assert cited, f"{DOC} cites no test: the check below would pass on nothing"
    problems = [m for w in cited if (m := _missing(w, files, defined))]
    assert problems == []


def test_a_section_heading_names_its_test_file_by_path() -> None:
    """A heading's file is where the section's bare test names are looked for."""
    cited = [
        (heading, word)
        for heading in re.findall(r"^#+ .*$", DOC.read_text(), re.MULTILINE)
        for word in _cited(heading)
    ]
    assert cited, f"no heading of {DOC} names a test file: the check below would pass on nothing"
    for heading, word in cited:
        assert word.startswith("tests/") and (ROOT / word).is_file(), heading
