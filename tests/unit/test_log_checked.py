"""strom.log.checked: the file ranges whose CRCs a node has taken, against a model (the set of
checked byte positions)."""

from __future__ import annotations

from itertools import pairwise

import pytest
from hypothesis import given
from hypothesis import strategies as st

from strom.log import checked
from strom.log.checked import CheckedRanges

ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(0, 200), st.integers(0, 60)),
        st.tuples(st.just("cut"), st.integers(0, 220), st.just(0)),
    ),
    max_size=40,
)


@given(ops)
def test_ranges_match_the_checked_positions(steps: list[tuple[str, int, int]]) -> None:
    r = CheckedRanges()
    model: set[int] = set()
    for op, a, n in steps:
        if op == "add":
            r.add(a, a + n)
            model |= set(range(a, a + n))
        else:
            r.cut(a)
            model = {p for p in model if p < a}
        spans = r.ranges()
        # Disjoint, sorted, not touching, none empty: one range per run of checked bytes.
        assert all(s < e for s, e in spans)
        assert all(e1 < s2 for (_, e1), (s2, _) in pairwise(spans))
        assert {p for s, e in spans for p in range(s, e)} == model
        for p in range(0, 230, 7):
            end = r.until(p)
            if p in model:
                assert end > p and all(q in model for q in range(p, end)) and end not in model
            else:
                assert end == p


def test_past_the_bound_the_ranges_start_over(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(checked, "MAX_RANGES", 4)
    r = CheckedRanges()
    for i in range(4):
        r.add(10 * i, 10 * i + 5)
    assert len(r.ranges()) == 4
    r.add(2, 7)  # merges into the first: still 4
    assert r.ranges()[0] == (0, 7) and len(r.ranges()) == 4
    r.add(100, 105)  # a fifth: forgets the others (they are checked again when read)
    assert r.ranges() == [(100, 105)]
    assert r.until(0) == 0 and r.until(101) == 105
