"""``strom transactions list|describe|fence|producers|find-hanging|abort``: transactions from
the shell, as Kafka's ``kafka-transactions.sh`` shows and handles them.

``list`` asks every coordinator that owns a shard of ``__transaction_state`` (from a storage
node's FindCoordinator with ``all_shards``); ``describe`` asks the id's own coordinator
(FindCoordinator). ``producers`` and ``abort`` ask partition leaders (DescribeProducers,
WriteTxnMarkers): they find and end a hanging transaction, one no coordinator will end
(Kafka's KIP-664). ``find-hanging`` puts both sides together as Kafka's does: a transaction
open in a partition for longer than the longest a transaction may last, which no coordinator
has as ongoing there for that producer and epoch.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

import grpc

from strom.api import coordinator_pb2, coordinator_pb2_grpc, storage_pb2
from strom.argtypes import number_above, topic_name, transactional_id
from strom.cli.admin import answering_client
from strom.cli.groups import _table
from strom.cli.jsonout import message_json
from strom.client.admin import Admin, ProducerState
from strom.client.cluster import ClusterClient, older_node
from strom.client.types import TopicPartition
from strom.errors import (
    COORDINATOR_REFRESH_CODES,
    CoordinatorNotAvailableError,
    ErrorCode,
    StromError,
    error_for,
)

E = ErrorCode
_RETRY = (*COORDINATOR_REFRESH_CODES, E.COORDINATOR_LOAD_IN_PROGRESS)


def state_name(state: int) -> str:
    """``TRANSACTION_STATE_PREPARE_COMMIT`` → ``PrepareCommit`` (Kafka's spelling)."""
    name = coordinator_pb2.TransactionState.Name(state).removeprefix("TRANSACTION_STATE_")
    return "".join(w.capitalize() for w in name.split("_"))


#: Kafka's state names (what --state takes) → TransactionState values.
_STATES = {
    state_name(v): v
    for v in coordinator_pb2.TransactionState.values()
    if v
    not in (coordinator_pb2.TRANSACTION_STATE_UNSPECIFIED, coordinator_pb2.TRANSACTION_STATE_DEAD)
}


def add_transactions_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    txn = sub.add_parser(
        "transactions",
        help="list, describe and fence transactional ids; find and abort hanging transactions",
    )
    tsub = txn.add_subparsers(dest="txn_cmd", metavar="ACTION")
    tsub.required = True
    ls = tsub.add_parser(
        "list",
        parents=[common],
        help="every transactional id and its state (exit 2: some coordinator did not answer, "
        "the list is partial)",
    )
    ls.add_argument(
        "--state",
        action="append",
        choices=sorted(_STATES),
        help="only ids in this state; repeatable",
    )
    ls.add_argument("--json", action="store_true")
    d = tsub.add_parser("describe", parents=[common], help="one transactional id in detail")
    d.add_argument("transactional_id", type=transactional_id)
    d.add_argument("--json", action="store_true")
    f = tsub.add_parser(
        "fence",
        parents=[common],
        help="bump the epoch of transactional ids: aborts what they left open (a killed "
        "producer's transaction holding read_committed readers back), refuses their old "
        "producers from then on",
    )
    f.add_argument(
        "transactional_ids", nargs="+", type=transactional_id, metavar="TRANSACTIONAL_ID"
    )
    pr = tsub.add_parser(
        "producers",
        parents=[common],
        help="the producers a partition's leader keeps state for, and their open "
        "transactions (what holds read_committed readers back); exit 2: some partition did "
        "not answer (named on stderr), the others are shown",
    )
    pr.add_argument("topic", type=topic_name)
    pr.add_argument("--partition", type=int, action="append", help="repeatable; default: all")
    pr.add_argument("--json", action="store_true")
    fh = tsub.add_parser(
        "find-hanging",
        parents=[common],
        help="transactions open in a partition for longer than --max-transaction-timeout that "
        "no coordinator has as ongoing there (end each with `strom transactions abort`); exit "
        "2: some partition or coordinator did not answer, the result may be incomplete",
    )
    fh.add_argument(
        "--topic",
        action="append",
        type=topic_name,
        help="repeatable; default: every topic but the internal ones",
    )
    fh.add_argument(
        "--max-transaction-timeout",
        type=number_above(0, inclusive=True),
        default=15.0,
        metavar="MINUTES",
        help="open longer than this counts (the coordinators' --transaction-max-timeout-ms; "
        "default: %(default)s minutes, Kafka's transaction.max.timeout.ms)",
    )
    fh.add_argument("--json", action="store_true")
    ab = tsub.add_parser(
        "abort",
        parents=[common],
        help="write an abort marker for a hanging transaction of one partition (one no "
        "coordinator will end): find it with `strom transactions producers`",
    )
    ab.add_argument("topic", type=topic_name)
    ab.add_argument("--partition", type=int, required=True)
    which = ab.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--start-offset", type=int, help="the open transaction's first offset in the partition"
    )
    which.add_argument("--producer-id", type=int, help="the producer whose transaction to abort")


def run_transactions(args: argparse.Namespace, out: Any) -> int:
    with answering_client(args.bootstrap) as client:
        if args.txn_cmd == "list":
            return _list(client, args, out)
        if args.txn_cmd == "fence":
            with Admin(cluster_client=client) as admin:
                fenced = admin.fence_producers(args.transactional_ids)
            for tid, (pid, epoch) in fenced.items():
                if epoch == 0:  # InitProducerId registered it just now
                    print(f"{tid} had no producer (now producer id {pid}, epoch 0)", file=out)
                else:
                    print(f"fenced {tid}: producer id {pid}, epoch {epoch}", file=out)
            return 0
        if args.txn_cmd == "producers":
            return _producers(client, args, out)
        if args.txn_cmd == "abort":
            return _abort(client, args, out)
        if args.txn_cmd == "find-hanging":
            return _find_hanging(client, args, out)
        return _describe(client, args, out)


def _producers(client: ClusterClient, args: argparse.Namespace, out: Any) -> int:
    with Admin(cluster_client=client) as admin:
        count = admin.describe_topic(args.topic).partition_count
        parts = args.partition or list(range(count))
        for p in parts:
            if not 0 <= p < count:
                raise StromError(f"{args.topic} has partitions 0-{count - 1}, not {p}")
        tps = [TopicPartition(args.topic, p) for p in parts]
        states, failed = _producer_states(admin, tps, "producers")
    code = 2 if failed else 0
    if args.json:
        rows = [
            {"topic": tp.topic, "partition": tp.partition, **s._asdict()}
            for tp, ss in states.items()
            for s in ss
        ]
        print(json.dumps(rows), file=out)
        return code
    now_ms = time.time() * 1000
    table = [("PARTITION", "PRODUCER-ID", "EPOCH", "LAST-SEQUENCE", "LAST-WRITE", "OPEN-TXN-AT")]
    for tp, ss in states.items():
        for s in ss:
            age = max(now_ms - s.last_timestamp_ms, 0) / 1000
            start = s.current_transaction_start_offset
            table.append(
                (
                    str(tp.partition),
                    str(s.producer_id),
                    str(s.producer_epoch),
                    str(s.last_sequence),
                    f"{age:.0f}s ago",
                    "-" if start is None else str(start),
                )
            )
    _table(table, out)
    return code


def _producer_states(
    admin: Admin, tps: list[TopicPartition], action: str
) -> tuple[dict[TopicPartition, list[ProducerState]], dict[TopicPartition, StromError]]:
    """DescribeProducers of ``tps``; a partition that fails is named on stderr and left out."""
    failed: dict[TopicPartition, StromError] = {}
    if not tps:
        return {}, failed
    try:
        states = admin.describe_producers(tps)
    except StromError:
        # One partition without a leader must not hide the others (exactly when an
        # operator hunts a hanging transaction): ask each on its own.
        states = {}
        with ThreadPoolExecutor(min(8, len(tps)), "strom-cli-producers") as pool:
            asked = {tp: pool.submit(admin.describe_producers, [tp]) for tp in tps}
        for tp, future in asked.items():
            try:
                states[tp] = future.result()[tp]
            except StromError as exc:
                failed[tp] = exc
    for tp, exc in failed.items():
        print(f"strom transactions {action}: {tp.topic}-{tp.partition}: {exc}", file=sys.stderr)
    return states, failed


#: Coordinator states in which a transaction may still have its partitions open.
_OPEN_STATES = frozenset(
    {
        coordinator_pb2.TRANSACTION_STATE_ONGOING,
        coordinator_pb2.TRANSACTION_STATE_PREPARE_COMMIT,
        coordinator_pb2.TRANSACTION_STATE_PREPARE_ABORT,
    }
)


def _find_hanging(client: ClusterClient, args: argparse.Namespace, out: Any) -> int:
    """Kafka's ``find-hanging``: open transactions older than the longest a transaction may
    last, then each one's producer id looked up in every coordinator (ListTransactions by
    producer id, DescribeTransactions of the ids found). It hangs when no coordinator has a
    transaction of that producer and epoch in progress with the partition in it: nothing
    will ever write its marker."""
    now_ms = time.time() * 1000
    limit_ms = args.max_transaction_timeout * 60_000
    with Admin(cluster_client=client) as admin:
        topics = args.topic or sorted(t for t in admin.list_topics() if not t.startswith("__"))
        tps = [
            TopicPartition(t, p)
            for t in topics
            for p in range(admin.describe_topic(t).partition_count)
        ]
        states, failed = _producer_states(admin, tps, "find-hanging")
    candidates = [
        (tp, st)
        for tp, ss in states.items()
        for st in ss
        if st.current_transaction_start_offset is not None
        and now_ms - st.last_timestamp_ms >= limit_ms
    ]
    owners, partial = _listings(client, {st.producer_id for _, st in candidates})
    described: dict[str, coordinator_pb2.TransactionDescription] = {}
    for tid in sorted(set(owners.values())):
        try:
            described[tid] = _describe_txn(client, tid)
        except StromError as exc:
            print(f"strom transactions find-hanging: {tid}: {exc}", file=sys.stderr)
            partial = True
    hanging: list[tuple[TopicPartition, ProducerState, str]] = []
    for tp, st in candidates:
        tid = owners.get(st.producer_id)
        d = described.get(tid) if tid is not None else None
        if tid is None:
            if partial:
                continue  # an unanswered coordinator may have it
            why = "no coordinator knows the producer id"
        elif d is None:
            continue  # (named on stderr)
        elif d.producer_id != st.producer_id or d.producer_epoch != st.producer_epoch:
            why = f"{tid} is at producer id {d.producer_id}, epoch {d.producer_epoch}"
        elif d.state not in _OPEN_STATES:
            why = f"{tid} is {state_name(d.state)}"
        elif not any(t.topic == tp.topic and tp.partition in t.partitions for t in d.topics):
            why = f"{tid}'s transaction does not include the partition"
        else:
            continue
        hanging.append((tp, st, why))
    if args.json:
        rows = [
            {"topic": tp.topic, "partition": tp.partition, **st._asdict(), "reason": why}
            for tp, st, why in hanging
        ]
        print(json.dumps(rows), file=out)
    else:
        table = [("TOPIC", "PARTITION", "PRODUCER-ID", "EPOCH", "START-OFFSET", "OPEN-FOR", "WHY")]
        for tp, st, why in hanging:
            table.append(
                (
                    tp.topic,
                    str(tp.partition),
                    str(st.producer_id),
                    str(st.producer_epoch),
                    str(st.current_transaction_start_offset),
                    f"{max(now_ms - st.last_timestamp_ms, 0) / 60_000:.1f} min",
                    why,
                )
            )
        _table(table, out)
        if hanging:
            tp, st, _ = hanging[0]
            print(
                "end one with: strom transactions abort TOPIC --partition P --start-offset O "
                f"(e.g. {tp.topic} --partition {tp.partition} --start-offset "
                f"{st.current_transaction_start_offset})",
                file=out,
            )
    if failed or partial:
        print(
            "strom transactions find-hanging: incomplete: some partitions or transaction "
            "coordinators did not answer",
            file=sys.stderr,
        )
        return 2
    return 0


def _listings(client: ClusterClient, producer_ids: set[int]) -> tuple[dict[int, str], bool]:
    """producer id -> transactional id, from every coordinator; and whether some shard did
    not answer (then a missing id proves nothing)."""
    if not producer_ids:
        return {}, False
    listed, partial, _ = _list_everywhere(
        client, coordinator_pb2.ListTransactionsRequest(producer_id_filters=sorted(producer_ids))
    )
    return {t.producer_id: t.transactional_id for t in listed}, partial


def _list_everywhere(
    client: ClusterClient, request: coordinator_pb2.ListTransactionsRequest
) -> tuple[list[coordinator_pb2.TransactionListing], bool, bool]:
    """ListTransactions of every coordinator owning a shard of ``__transaction_state`` (from
    a storage node's FindCoordinator, not DescribeCluster: that needs DESCRIBE on the
    cluster, and listing only DESCRIBE on the ids listed): the listings,
    whether some shard did not answer (no owner, a coordinator down or still loading), and
    whether any coordinator was asked at all."""
    owners = client.coordinator_shards(storage_pb2.COORDINATOR_TYPE_TRANSACTION)
    addresses = sorted({a for a in owners.values() if a is not None})
    partial = None in owners.values()
    listed: list[coordinator_pb2.TransactionListing] = []
    for addr in addresses:
        stub = coordinator_pb2_grpc.CoordinatorServiceStub(client.channel(addr))
        try:
            resp = stub.ListTransactions(request, timeout=client.timeout_s)
        except grpc.RpcError:
            partial = True
            continue
        partial = partial or bool(resp.unloaded_shards)
        listed.extend(resp.transactions)
    return listed, partial, bool(addresses)


def _abort(client: ClusterClient, args: argparse.Namespace, out: Any) -> int:
    tp = TopicPartition(args.topic, args.partition)
    with Admin(cluster_client=client) as admin:
        states = admin.describe_producers([tp])[tp]
        if args.start_offset is not None:
            found = [s for s in states if s.current_transaction_start_offset == args.start_offset]
            what = f"no transaction open at offset {args.start_offset}"
        else:
            found = [s for s in states if s.producer_id == args.producer_id]
            what = f"producer id {args.producer_id} has no state"
            if found and found[0].current_transaction_start_offset is None:
                what = f"producer id {args.producer_id} has no transaction open"
                found = []
        if not found:
            open_at = sorted(
                s.current_transaction_start_offset
                for s in states
                if s.current_transaction_start_offset is not None
            )
            raise StromError(
                f"{args.topic}-{args.partition}: {what} (open transactions start at: "
                f"{', '.join(map(str, open_at)) or 'none'})"
            )
        s = found[0]
        admin.abort_transaction(tp, s.producer_id, s.producer_epoch, s.coordinator_epoch)
    print(
        f"aborted the transaction of producer id {s.producer_id} (epoch {s.producer_epoch}) "
        f"open in {args.topic}-{args.partition} since offset "
        f"{s.current_transaction_start_offset}",
        file=out,
    )
    return 0


def _list(client: ClusterClient, args: argparse.Namespace, out: Any) -> int:
    wanted = {_STATES[s] for s in args.state or ()}
    listed, unloaded, asked = _list_everywhere(
        client, coordinator_pb2.ListTransactionsRequest(state_filters=sorted(wanted))
    )
    rows = {t.transactional_id: t for t in listed}
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "transactional_id": t.transactional_id,
                        "producer_id": t.producer_id,
                        "state": state_name(t.state),
                    }
                    for _, t in sorted(rows.items())
                ]
            ),
            file=out,
        )
    else:
        table = [("TRANSACTIONAL-ID", "PRODUCER-ID", "STATE")]
        table += [
            (t.transactional_id, str(t.producer_id), state_name(t.state))
            for _, t in sorted(rows.items())
        ]
        _table(table, out)
    if unloaded or not asked:
        # On stderr, so that --json output stays JSON; exit 2 tells a script the list is
        # partial.
        print(
            "strom transactions list: incomplete: some transaction coordinator shards are not "
            "available",
            file=sys.stderr,
        )
        return 2
    return 0


def _describe(client: ClusterClient, args: argparse.Namespace, out: Any) -> int:
    d = _describe_txn(client, args.transactional_id)
    if args.json:
        print(message_json(d), file=out)
        return 0
    started = (
        datetime.fromtimestamp(d.transaction_start_ms / 1000, UTC).isoformat(timespec="seconds")
        if d.transaction_start_ms >= 0
        else "-"
    )
    parts = ", ".join(f"{tp.topic}-{p}" for tp in d.topics for p in tp.partitions) or "-"
    rows = [
        ("transactional id", d.transactional_id),
        ("state", state_name(d.state)),
        ("producer id / epoch", f"{d.producer_id} / {d.producer_epoch}"),
        ("timeout ms", str(d.transaction_timeout_ms)),
        ("started", started),
        ("partitions", parts),
        ("groups", ", ".join(d.groups) or "-"),
        ("shard", str(d.shard)),
    ]
    for k, v in rows:
        print(f"{k:<20} {v}", file=out)
    return 0


def _describe_txn(client: ClusterClient, tid: str) -> coordinator_pb2.TransactionDescription:
    """One transactional id's description from its coordinator (retried while it moves)."""
    deadline = time.monotonic() + client.retry_s
    last = "no coordinator"
    while True:
        try:
            addr: str | None = client.find_coordinator(
                tid, storage_pb2.COORDINATOR_TYPE_TRANSACTION
            )
        except CoordinatorNotAvailableError as exc:
            # Kept for the last error, which would otherwise say just "no coordinator".
            addr, last = None, exc.message
        if addr is not None:
            stub = coordinator_pb2_grpc.CoordinatorServiceStub(client.channel(addr))
            try:
                resp = stub.DescribeTransactions(
                    coordinator_pb2.DescribeTransactionsRequest(transactional_ids=[tid]),
                    timeout=client.timeout_s,
                )
            except grpc.RpcError as exc:
                if (old := older_node(exc, addr, "DescribeTransactions")) is not None:
                    raise old from None
                last = f"{addr}: {exc.code().name}"
            else:
                d = resp.transactions[0]
                if d.error_code not in _RETRY:
                    break
                last = f"{addr}: {ErrorCode.Name(d.error_code)}"
        if time.monotonic() >= deadline:
            raise StromError(f"no coordinator answered for transactional id {tid!r} ({last})")
        time.sleep(0.2)
    if d.error_code != E.NONE:
        raise error_for(d.error_code, d.error_message)
    return d
