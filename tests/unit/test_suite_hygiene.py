"""The test suite's own rules, checked so that a new test cannot quietly break them: a test
waits on a condition, never on a guessed duration, and a test is never skipped (or marked to
fail) without saying why that cannot hide a failure in CI.

- A ``time.sleep``/``asyncio.sleep`` longer than :data:`MAX_UNJUSTIFIED_S`, or of a duration
  that is not a constant, needs a comment on its line or in the comment block right above it
  carrying one of :data:`SLEEP_REASONS` (time itself is what is tested, a poll interval of a
  condition, pacing a load, or no event that could stand for it). ``sleep(0)`` (a yield to
  the event loop) and short constants are fine.
- ``pytest.skip``, ``pytest.importorskip``, ``pytest.mark.skip``/``skipif`` and ``xfail``
  need a ``# skip is justified: ...`` comment the same way; ``xfail`` must also be
  ``strict=True`` (a non-strict xfail passes whatever happens).

Sleeps and skips inside string literals (programs the tests run in a child process) are not
seen: only the tests' own code is parsed.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
#: Longest fixed sleep allowed without a reason (a short poll interval, a nudge).
MAX_UNJUSTIFIED_S = 0.2
#: What a comment must say for a longer (or computed) sleep to stay.
SLEEP_REASONS = ("time is the behaviour", "poll interval", "pacing", "no event stands for it")
SKIP_REASON = "skip is justified"
_SKIP_CALLS = {"skip", "importorskip", "xfail"}
_SKIP_MARKS = {"skip", "skipif", "xfail"}


def _comment_block(lines: list[str], lineno: int) -> str:
    """The text of line ``lineno`` (1-based) and of the comment lines right above it."""
    out = [lines[lineno - 1]]
    i = lineno - 2
    while i >= 0 and lines[i].lstrip().startswith("#"):
        out.append(lines[i])
        i -= 1
    return "\n".join(out).lower()


def _is_sleep(call: ast.Call) -> bool:
    f = call.func
    if isinstance(f, ast.Attribute) and f.attr == "sleep":
        return isinstance(f.value, ast.Name) and f.value.id in {"time", "asyncio"}
    return isinstance(f, ast.Name) and f.id == "sleep"


def _needs_a_reason(call: ast.Call) -> bool:
    """Whether the sleep's duration is computed or longer than MAX_UNJUSTIFIED_S."""
    if not call.args:
        return False
    arg = call.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, int | float):
        return arg.value > MAX_UNJUSTIFIED_S
    return True


def _pytest_attr(node: ast.AST) -> list[str]:
    """``pytest.mark.skipif`` -> ["pytest", "mark", "skipif"]; [] for anything else."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return parts[::-1] if parts and parts[-1] == "pytest" else []


def _skip_kind(node: ast.AST) -> str | None:
    """ "skip"/"skipif"/"importorskip"/"xfail" for a pytest skip or xfail, else None."""
    target = node.func if isinstance(node, ast.Call) else node
    parts = _pytest_attr(target)
    if len(parts) == 2 and parts[1] in _SKIP_CALLS and isinstance(node, ast.Call):
        return parts[1]
    if len(parts) == 3 and parts[1] == "mark" and parts[2] in _SKIP_MARKS:
        return parts[2]
    return None


def findings(source: str, name: str) -> list[str]:
    """Every broken rule in one test module's source, as "name:line: what"."""
    lines = source.splitlines()
    out: list[tuple[int, str]] = []
    seen: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and _is_sleep(node) and _needs_a_reason(node):
            block = _comment_block(lines, node.lineno)
            if not any(reason in block for reason in SLEEP_REASONS):
                out.append(
                    (
                        node.lineno,
                        f"{name}:{node.lineno}: a fixed sleep ({ast.unparse(node)}): wait on the "
                        f"condition instead, or say why time itself is needed in a comment "
                        f"naming one of {SLEEP_REASONS}",
                    )
                )
        kind = _skip_kind(node)
        if kind is None or node.lineno in seen:
            continue
        seen.add(node.lineno)  # (a mark used as a call is one finding, not two)
        if SKIP_REASON not in _comment_block(lines, node.lineno):
            out.append(
                (
                    node.lineno,
                    f"{name}:{node.lineno}: pytest {kind} without a '# {SKIP_REASON}: ...' "
                    "comment saying why it cannot hide a failure in CI (a tool the setup installs "
                    "must fail loudly instead)",
                )
            )
        if kind == "xfail" and not _strict(node):
            out.append((node.lineno, f"{name}:{node.lineno}: xfail without strict=True passes"))
    return [text for _, text in sorted(out, key=lambda f: f[0])]


def _strict(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and any(
        k.arg == "strict" and isinstance(k.value, ast.Constant) and k.value.value is True
        for k in node.keywords
    )


def _test_sources() -> list[Path]:
    return sorted(p for p in TESTS.rglob("*.py") if "node_modules" not in p.parts)


def test_no_unjustified_fixed_sleeps_skips_or_lax_xfails_in_the_suite() -> None:
    sources = _test_sources()
    assert len(sources) > 100, f"found only {len(sources)} test modules under {TESTS}"
    problems = [
        f
        for path in sources
        for f in findings(path.read_text(), str(path.relative_to(TESTS.parent)))
    ]
    assert not problems, "\n".join(problems)


def test_the_check_finds_what_it_is_for_and_accepts_what_is_justified() -> None:
    bad = (
        "import asyncio, time, pytest\n"
        "def test_a():\n"
        "    time.sleep(1)\n"
        "    asyncio.sleep(delay)\n"
        "    pytest.skip('etcd may be missing')\n"
        "@pytest.mark.xfail(reason='flaky')\n"
        "def test_b(): ...\n"
    )
    found = findings(bad, "t.py")
    assert [f.split(": ", 1)[0] for f in found] == [
        "t.py:3",
        "t.py:4",
        "t.py:5",
        "t.py:6",
        "t.py:6",
    ]
    assert "xfail without strict=True" in found[-1]
    good = (
        "import asyncio, time, pytest\n"
        "def test_a():\n"
        "    time.sleep(0.05)\n"
        "    asyncio.sleep(0)\n"
        "    # time is the behaviour: a lease must run out\n"
        "    time.sleep(3)\n"
        "    time.sleep(interval)  # poll interval of the wait above\n"
        "    # skip is justified: CI never runs on Windows\n"
        "    pytest.skip('windows')\n"
        "# skip is justified: a known bug, tracked; strict, so a fix is noticed\n"
        "@pytest.mark.xfail(strict=True)\n"
        "def test_b(): ...\n"
    )
    assert findings(good, "t.py") == []
