"""The README's exactly-once loop ("Transactions (exactly-once pipelines)"), run as written,
as its own process (tests/integration/test_transactions.py runs several in one group).

The code block is taken from README.md at run time, so the test checks what users copy;
only the cluster address, names and the transactional id are replaced, the output topic is
left to the test to create, each record's processing takes a moment and the offsets reach
the coordinator late (so that rebalances land inside transactions, as under real load).
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path
from typing import Any

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_loop() -> str:
    """The README's consume-transform-produce block (the one with ``producer.transaction()``)."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    (block,) = [b for b in blocks if "producer.transaction()" in b]
    return block


def _replace(code: str, old: str, new: str) -> str:
    if old not in code:
        raise SystemExit(f"the README's loop changed: {old!r} is not in it any more")
    return code.replace(old, new)


def _slow_offsets() -> None:
    """Offsets reach the group coordinator 0.2 s after ``consumer.group_metadata()`` was read
    (a slow link under load): a rebalance that moves the member's epoch on meanwhile makes
    ``send_offsets_to_transaction`` fail with StaleMemberEpochError, the case the README's
    loop must survive, at nearly every rebalance instead of once in a while."""
    from strom.client.transactions import TransactionManager

    send_offsets = TransactionManager.send_offsets

    def slow(self: TransactionManager, *args: Any, **kwargs: Any) -> None:
        time.sleep(0.2)  # time is the behaviour: the injected slow link (see the docstring)
        send_offsets(self, *args, **kwargs)

    TransactionManager.send_offsets = slow  # type: ignore[method-assign]


def main() -> int:
    bootstrap, group, source, sink, worker = sys.argv[1:6]
    code = readme_loop()
    # The test creates the output topic (every worker running the README's create_topic
    # would fail all but the first).
    code = re.sub(r"with Admin\(.*?\n(    .*\n)+", "", code)
    code = _replace(code, '"127.0.0.1:9092"', repr(bootstrap))
    code = _replace(code, 'group_id="enricher"', f"group_id={group!r}")
    code = _replace(code, '["clicks"]', repr([source]))
    code = _replace(code, '"clicks-enriched"', repr(sink))
    code = _replace(code, 'transactional_id="enricher-1"', f"transactional_id={worker!r}")
    code = _replace(code, "r.value.upper()", "_process(r.value)")

    def _process(value: bytes) -> bytes:
        time.sleep(0.002)  # the work a real transform does: rebalances land mid-transaction
        return value.upper()

    _slow_offsets()
    print("running the README loop", flush=True)
    exec(compile(code, str(README), "exec"), {"_process": _process, "__name__": "readme"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
