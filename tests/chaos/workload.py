"""The chaos workload: client processes that write every operation and outcome to history.

``python -m tests.chaos.workload producer|member|pipeline|monitor BOOTSTRAP --name N --out DIR``

- **producer**: an idempotent producer (acks=all) sending keyed records whose value is
  ``<writer>:<seq>`` (writer = name and incarnation, so every value is unique in the run);
  ``send`` before each record, then ``ack`` (partition, offset) or ``fail`` (error).
- **member**: a consumer-group member that lives ``--lifetime-s`` and then leaves; logs its
  assignment, every record it receives (partition, offsets, values) and every commit, sync
  or async at random, with its outcome.
- **pipeline**: a transactional consume-transform-produce loop (read_committed input,
  output keyed ``<partition>:<offset>`` of the input record, offsets committed in the
  transaction); logs each transaction's input ranges and outcome.
- **monitor**: reads the groups' committed offsets once a second (OffsetFetch), so the
  checker sees whether they ever go backwards.

Each process stops cleanly on SIGTERM (flush, commit, close); the nemesis may SIGKILL it.
"""

from __future__ import annotations

import argparse
import random
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from strom import Consumer, OffsetAndMetadata, Producer, TopicPartition
from strom.errors import ProducerFencedError, StromError
from tests.chaos.history import History

INPUT = "chaos"
OUTPUT = "chaos-out"
GROUP = "chaos-g"
TXN_GROUP = "chaos-txn"

_stop = threading.Event()


def _on_term(*_: object) -> None:
    _stop.set()


def _err(exc: BaseException | None) -> str:
    if exc is None:
        return ""
    return f"{type(exc).__name__}: {exc}"[:300]


# -- producer -------------------------------------------------------------------------------


def run_producer(args: argparse.Namespace) -> int:
    writer = f"{args.name}.{args.incarnation}"
    rnd = random.Random(f"{args.seed}:{writer}")
    h = History(Path(args.out) / f"{args.name}.jsonl", w=writer)
    producer = Producer(
        args.bootstrap,
        acks="all",
        linger_ms=5,
        request_timeout_ms=8_000,
        delivery_timeout_ms=90_000,
        max_block_ms=30_000,
        client_id=writer,
    )
    h.write("start")
    seq = 0
    interval = 1.0 / max(args.rate, 1)

    def on_done(s: int) -> Any:
        def cb(md: Any, exc: BaseException | None) -> None:
            if exc is None:
                h.write("ack", s=s, p=md.partition, o=md.offset)
            else:
                h.write("fail", s=s, err=_err(exc))

        return cb

    next_at = time.monotonic()
    while not _stop.is_set():
        burst = rnd.randint(1, 10)
        for _ in range(burst):
            key = f"k{rnd.randrange(64)}"
            h.write("send", s=seq, k=key)
            try:
                producer.send(
                    INPUT, f"{writer}:{seq}".encode(), key=key.encode(), callback=on_done(seq)
                )
            except StromError as exc:
                h.write("fail", s=seq, err=_err(exc))
            seq += 1
        next_at += burst * interval
        _stop.wait(max(0.0, next_at - time.monotonic()))
        if time.monotonic() - next_at > 5:
            next_at = time.monotonic()  # far behind (a stall): do not burst to catch up
    try:
        producer.flush(timeout=60)
    except StromError as exc:
        h.write("flush_fail", err=_err(exc))
    producer.close(timeout=10)
    h.write("closed", sent=seq)
    return 0


# -- group member ---------------------------------------------------------------------------


def run_member(args: argparse.Namespace) -> int:
    member = f"{args.name}.{args.incarnation}"
    rnd = random.Random(f"{args.seed}:{member}")
    h = History(Path(args.out) / f"{args.name}.jsonl", m=member)
    consumer = Consumer(
        args.bootstrap,
        group_id=GROUP,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        request_timeout_ms=8_000,
        client_id=member,
    )
    consumer.subscribe([INPUT])
    h.write("start")
    owned: list[int] = []
    commit_id = 0
    end = time.monotonic() + args.lifetime_s
    while not _stop.is_set() and time.monotonic() < end:
        try:
            records = consumer.poll(timeout_ms=200, max_records=400)
        except StromError as exc:
            h.write("poll_fail", err=_err(exc))
            _stop.wait(0.5)
            continue
        now = sorted(tp.partition for tp in consumer.assignment())
        if now != owned:
            owned = now
            h.write("assign", parts=owned)
        if not records:
            continue
        by_part: dict[int, tuple[list[int], list[str]]] = {}
        for r in records:
            offs, vals = by_part.setdefault(r.partition, ([], []))
            offs.append(r.offset)
            vals.append(r.value.decode())
        for p, (offs, vals) in sorted(by_part.items()):
            h.write("recv", p=p, o=offs, v=vals)
        offsets = {
            TopicPartition(INPUT, p): OffsetAndMetadata(offs[-1] + 1)
            for p, (offs, _) in by_part.items()
        }
        commit_id += 1
        cid = commit_id
        plain = {str(tp.partition): om.offset for tp, om in offsets.items()}
        if rnd.random() < 0.5:
            h.write("commit", id=cid, mode="sync", offsets=plain)
            try:
                consumer.commit(offsets)
                h.write("commit_ok", id=cid, offsets=plain)
            except StromError as exc:
                h.write("commit_fail", id=cid, err=_err(exc))
        else:
            h.write("commit", id=cid, mode="async", offsets=plain)

            def done(
                _o: Any, exc: BaseException | None, cid: int = cid, plain: Any = plain
            ) -> None:
                if exc is None:
                    h.write("commit_ok", id=cid, offsets=plain)
                else:
                    h.write("commit_fail", id=cid, err=_err(exc))

            try:
                consumer.commit_async(offsets, callback=done)
            except StromError as exc:
                h.write("commit_fail", id=cid, err=_err(exc))
    try:
        consumer.close(autocommit=False)
    except StromError as exc:
        h.write("close_fail", err=_err(exc))
    h.write("closed")
    return 0


# -- transactional pipeline -----------------------------------------------------------------


def run_pipeline(args: argparse.Namespace) -> int:
    name = f"{args.name}.{args.incarnation}"
    h = History(Path(args.out) / f"{args.name}.jsonl", x=name)
    producer = Producer(
        args.bootstrap,
        transactional_id=args.name,
        linger_ms=5,
        request_timeout_ms=8_000,
        transaction_timeout_ms=args.transaction_timeout_ms,
        max_block_ms=30_000,
        client_id=name,
    )
    producer.init_transactions()
    consumer = Consumer(
        args.bootstrap,
        group_id=TXN_GROUP,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        isolation_level="read_committed",
        request_timeout_ms=8_000,
        client_id=name,
    )
    consumer.subscribe([INPUT])
    h.write("start")
    txn = 0
    while not _stop.is_set():
        try:
            records = consumer.poll(timeout_ms=200, max_records=200)
        except StromError as exc:
            h.write("poll_fail", err=_err(exc))
            _stop.wait(0.5)
            continue
        if not records:
            continue
        txn += 1
        ranges: dict[str, list[int]] = {}
        for r in records:
            lo_hi = ranges.setdefault(str(r.partition), [r.offset, r.offset])
            lo_hi[1] = r.offset
        h.write("txn_begin", id=txn, inputs=ranges, n=len(records))
        try:
            producer.begin_transaction()
            for r in records:
                producer.send(OUTPUT, r.value, key=f"{r.partition}:{r.offset}".encode())
            # The offsets after exactly what this transaction read (a partition the group
            # has taken away since the poll makes the commit fail, and the records go back).
            offsets = {
                TopicPartition(INPUT, int(p)): OffsetAndMetadata(hi + 1)
                for p, (_lo, hi) in ranges.items()
            }
            producer.send_offsets_to_transaction(offsets, consumer.group_metadata())
            producer.commit_transaction()
            h.write("txn_commit", id=txn)
        except ProducerFencedError as exc:
            h.write("txn_fenced", id=txn, err=_err(exc))
            return 3
        except StromError as exc:
            h.write("txn_fail", id=txn, err=_err(exc))
            try:
                producer.abort_transaction()
                h.write("txn_abort", id=txn)
            except StromError as exc2:
                h.write("txn_abort_fail", id=txn, err=_err(exc2))
                return 4  # the orchestrator starts a new instance, which fences this one
            # Rewind to the committed offsets: the aborted records must be processed again.
            _rewind(consumer, h)
    try:
        consumer.close(autocommit=False)
        producer.close(timeout=20)
    except StromError as exc:
        h.write("close_fail", err=_err(exc))
    h.write("closed")
    return 0


def _rewind(consumer: Consumer, h: History) -> None:
    tps = list(consumer.assignment())
    if not tps:
        return
    try:
        committed = consumer.committed(tps)
    except StromError as exc:
        h.write("rewind_fail", err=_err(exc))
        raise SystemExit(5) from exc  # positions unknown: a fresh instance starts cleanly
    for tp in tps:
        om = committed.get(tp)  # type: ignore[union-attr]
        if om is not None:
            consumer.seek(tp, om.offset)
        else:
            consumer.seek_to_beginning([tp])
    to = {str(tp.partition): (committed.get(tp) or OffsetAndMetadata(0)).offset for tp in tps}  # type: ignore[union-attr]
    h.write("rewind", to=to)


# -- committed-offset monitor ---------------------------------------------------------------


def run_monitor(args: argparse.Namespace) -> int:
    h = History(Path(args.out) / f"{args.name}.jsonl", x=args.name)
    consumers = {
        g: Consumer(
            args.bootstrap,
            group_id=g,
            enable_auto_commit=False,
            request_timeout_ms=5_000,
            isolation_level="read_committed" if g == TXN_GROUP else "read_uncommitted",
        )
        for g in (GROUP, TXN_GROUP)
    }
    tps: list[TopicPartition] = []
    while not _stop.is_set():
        try:
            if not tps:
                parts = next(iter(consumers.values())).partitions_for_topic(INPUT)
                tps = [TopicPartition(INPUT, p) for p in sorted(parts)]
            for g, c in consumers.items():
                got = c.committed(tps)
                h.write(
                    "offsets",
                    g=g,
                    offsets={str(tp.partition): om.offset for tp, om in got.items() if om},  # type: ignore[union-attr]
                )
        except StromError as exc:
            h.write("offsets_fail", err=_err(exc))
        _stop.wait(1.0)
    for c in consumers.values():
        c.close(autocommit=False)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="tests.chaos.workload")
    ap.add_argument("role", choices=["producer", "member", "pipeline", "monitor"])
    ap.add_argument("bootstrap")
    ap.add_argument("--name", required=True)
    ap.add_argument("--incarnation", type=int, default=0)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", default="0")
    ap.add_argument("--rate", type=float, default=50.0, help="producer: records per second")
    ap.add_argument("--lifetime-s", type=float, default=60.0, help="member: how long it stays")
    ap.add_argument("--transaction-timeout-ms", type=int, default=20_000)
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, _on_term)
    runner = {
        "producer": run_producer,
        "member": run_member,
        "pipeline": run_pipeline,
        "monitor": run_monitor,
    }[args.role]
    try:
        return runner(args)
    except StromError as exc:
        print(f"{args.role} {args.name}: {_err(exc)}", file=sys.stderr, flush=True)
        return 2
    finally:
        sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
