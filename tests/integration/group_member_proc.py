"""A consumer-group member in its own process, for tests that SIGKILL a member.

Usage: ``python group_member_proc.py BOOTSTRAP GROUP TOPIC``. It polls and, for every batch,
prints one ``R <partition> <offset>`` line per record *before* committing (at-least-once:
processing happens first), then commits synchronously and prints ``C <partition> <offset>``
for what is now durable, and ``A <p,p,...>`` whenever its assignment changes. Every line is
flushed so a parent reading the pipe sees exactly what happened before a SIGKILL.
"""

from __future__ import annotations

import sys

from strom.client.consumer import Consumer


def main(bootstrap: str, group: str, topic: str) -> None:
    consumer = Consumer(
        bootstrap, group_id=group, auto_offset_reset="earliest", enable_auto_commit=False
    )
    consumer.subscribe([topic])
    owned: list[int] = []
    while True:
        records = consumer.poll(50)
        now = sorted(tp.partition for tp in consumer.assignment())
        if now != owned:
            owned = now
            print("A " + ",".join(map(str, owned)), flush=True)
        if not records:
            continue
        print("\n".join(f"R {r.partition} {r.offset}" for r in records), flush=True)
        last: dict[int, int] = {}
        for r in records:
            last[r.partition] = max(last.get(r.partition, -1), r.offset)
        try:
            consumer.commit()
        except Exception as e:  # e.g. fenced by a rebalance: the records will be re-read
            print(f"E {e!r}", flush=True)
            continue
        print("\n".join(f"C {p} {o + 1}" for p, o in sorted(last.items())), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:4])
