"""strom.service.limits.Admission alone: the in-flight produce budget and the share of it
that requests of principals over their quotas may hold."""

from __future__ import annotations

from strom.service.limits import Admission


def test_the_budget_admits_one_request_alone_and_sheds_past_it() -> None:
    a = Admission(max_inflight_bytes=100)
    assert a.try_admit(500) is None  # nothing in flight: even a larger one passes alone
    assert "would pass the node's budget of 100" in (a.try_admit(1) or "")
    a.release(500)
    assert a.try_admit(60) is None and a.try_admit(40) is None
    assert a.try_admit(1) is not None
    assert a.shed == 2


def test_principals_over_their_quota_hold_a_quarter_each_and_half_in_all() -> None:
    """Requests that will wait out their principal's quota hold their bytes meanwhile; they
    get a quarter of the budget per principal and half in all, so that others still get
    in (found in review: one principal far over its quota filled the budget)."""
    a = Admission(max_inflight_bytes=1000)
    assert a.try_admit(300, "User:hog") is None  # alone: passes, even above a quarter
    refusal = a.try_admit(1, "User:hog") or ""
    assert "User:hog is over its produce quota and 300 bytes" in refusal
    assert a.try_admit(200, "User:pig") is None
    assert a.try_admit(100, "User:boar") is not None  # 500 + 100 > half of the budget
    assert a.try_admit(400) is None  # principals within their quota: the rest is theirs
    assert a.inflight_bytes == 900 and a.owing_bytes == 500
    a.release(300, "User:hog")
    assert a.owing == {"User:pig": 200}
    assert a.try_admit(100, "User:boar") is None
    a.release(200, "User:pig")
    a.release(100, "User:boar")
    a.release(400)
    assert (a.inflight_bytes, a.owing_bytes, a.owing) == (0, 0, {})
