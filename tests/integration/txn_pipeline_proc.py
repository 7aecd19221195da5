"""A consume-transform-produce loop with exactly-once semantics, as its own process so that
tests can SIGKILL it (tests/integration/test_transactions.py).

Reads ``input`` as a member of ``group`` (read_committed), writes each record to ``output``
keyed by its input position ("partition:offset") and commits the input offsets in the same
transaction. ``--crash`` makes the N-th transaction die at a chosen point: before
``commit_transaction()``, while its EndTxn is in flight, or just after it returned.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading

from strom import Consumer, OffsetAndMetadata, Producer


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("bootstrap")
    ap.add_argument("--transactional-id", required=True)
    ap.add_argument("--group", required=True)
    ap.add_argument("--input", required=True)
    ap.add_argument("--output", required=True)
    ap.add_argument("--crash", choices=["before_commit", "during_commit", "after_commit"])
    ap.add_argument("--crash-at", type=int, default=3, help="which transaction dies")
    args = ap.parse_args()

    producer = Producer(args.bootstrap, transactional_id=args.transactional_id, linger_ms=2)
    producer.init_transactions()
    consumer = Consumer(
        args.bootstrap,
        group_id=args.group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        isolation_level="read_committed",
    )
    consumer.subscribe([args.input])
    print("ready", flush=True)
    n = 0
    while True:
        records = consumer.poll(timeout_ms=200, max_records=300)
        if not records:
            continue
        producer.begin_transaction()
        for r in records:
            producer.send(args.output, r.value, key=f"{r.partition}:{r.offset}".encode())
        offsets = {tp: OffsetAndMetadata(consumer.position(tp)) for tp in consumer.assignment()}
        producer.send_offsets_to_transaction(offsets, consumer.group_metadata())
        n += 1
        dies = args.crash is not None and n == args.crash_at
        if dies and args.crash == "before_commit":
            producer.flush()  # the records are in the log: the new instance must abort them
            os._exit(9)
        if dies and args.crash == "during_commit":
            producer.flush()  # the records are in: the kill lands around EndTxn
            threading.Timer(0.001, os._exit, args=(9,)).start()
        producer.commit_transaction()
        if dies and args.crash == "after_commit":
            os._exit(9)
        print(f"committed {n} {len(records)}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
