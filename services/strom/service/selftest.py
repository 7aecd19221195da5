"""``python -m strom.service.selftest --bootstrap HOST:PORT``: produce one record and read it
back; exit 0 when the cluster served both, else 1 with one line saying what failed.

The Helm chart's ``helm test`` pod runs it against a fresh install. The topic is created
when missing (replication factor min(3, live nodes)); each run writes a new, unique record
and looks for exactly that record at the offset the produce returned.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from collections.abc import Sequence

from strom import Admin, Consumer, Producer, StromError, TopicPartition

TOPIC = "strom-selftest"


def run(bootstrap: str, topic: str, timeout_s: float) -> str:
    """Produce and fetch one record; the line to print. Raises StromError/TimeoutError."""
    with Admin(bootstrap) as admin:
        if topic not in admin.list_topics():
            nodes = len(admin.describe_cluster().nodes)
            try:
                admin.create_topic(topic, partitions=1, replication_factor=max(1, min(3, nodes)))
            except StromError as exc:
                if "exists" not in str(exc).lower():
                    raise
    value = f"selftest {uuid.uuid4()}".encode()
    with Producer(bootstrap, acks="all") as producer:
        meta = producer.send(topic, value).result(timeout=timeout_s)
    deadline = time.monotonic() + timeout_s
    with Consumer(bootstrap) as consumer:
        tp = TopicPartition(topic, meta.partition)
        consumer.assign([tp])
        consumer.seek(tp, meta.offset)
        while time.monotonic() < deadline:
            for record in consumer.poll(timeout_ms=500):
                if record.offset == meta.offset:
                    if record.value != value:
                        raise StromError(f"offset {meta.offset} holds another record")
                    return f"produced and fetched {topic}-{meta.partition}@{meta.offset}"
    raise TimeoutError(f"the record at {topic}-{meta.partition}@{meta.offset} was not fetched")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m strom.service.selftest", description=__doc__)
    parser.add_argument("--bootstrap", default=os.environ.get("STROM_BOOTSTRAP"))
    parser.add_argument("--topic", default=TOPIC)
    parser.add_argument("--timeout-s", type=float, default=60.0)
    args = parser.parse_args(argv)
    if not args.bootstrap:
        parser.error("--bootstrap (or STROM_BOOTSTRAP) is required")
    try:
        print(run(args.bootstrap, args.topic, args.timeout_s))
    except (StromError, TimeoutError, OSError) as exc:
        print(f"selftest failed: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
