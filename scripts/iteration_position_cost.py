"""What ``position()`` costs inside ``for record in consumer`` as a poll grows.

Against a running cluster (``strom dev up --dir D --nodes 1``): creates a topic of
``--partitions`` partitions holding ``--records`` records in all, polls them in one go
(``max_poll_records=--records``), and times, in CPU seconds of this process, an iteration over
the poll that calls ``position()`` of the first partition at every record (the records of the
other partitions come after that partition's, so each call asks about a partition with no
record left in the poll: the case that scanned the rest of the poll before e7697d0).
docs/benchmarks.md (item 5 of "Where each goal stands") has the numbers::

    .venv/bin/python scripts/iteration_position_cost.py --bootstrap 127.0.0.1:PORT
"""

from __future__ import annotations

import argparse
import time
import uuid

from strom.client.admin import Admin
from strom.client.consumer import Consumer
from strom.client.producer import Producer
from strom.client.types import TopicPartition
from strom.devcluster.procs import wait_for


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--records", type=int, default=20_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--runs", type=int, default=2)
    args = ap.parse_args()
    topic = f"position-cost-{uuid.uuid4().hex[:8]}"
    with Admin(args.bootstrap) as admin:
        admin.create_topic(topic, partitions=args.partitions, replication_factor=1)
    tps = [TopicPartition(topic, p) for p in range(args.partitions)]
    each = args.records // args.partitions
    with Producer(args.bootstrap) as producer:
        for tp in tps:
            producer.send_batch(topic, [b"x" * 50] * each, partition=tp.partition).result(60)
    total = each * args.partitions
    for _ in range(args.runs):
        with Consumer(
            args.bootstrap,
            auto_offset_reset="earliest",
            max_poll_records=total,
            fetch_max_bytes=64 << 20,
            max_partition_fetch_bytes=64 << 20,
        ) as c:
            c.assign(tps)
            for tp in tps:
                c.position(tp)
            wait_for(
                lambda c=c: all(c.highwater(tp) == each for tp in tps),
                timeout=30,
                what="every partition's records fetched",
            )
            start = time.process_time()
            for handed, _record in enumerate(c, 1):
                c.position(tps[0])
                if handed == total:
                    break
            cpu = time.process_time() - start
        print(
            f"{total} records over {args.partitions} partitions, position() at each: "
            f"{cpu:.3f} s CPU ({cpu / total * 1e6:.1f} µs per record)"
        )


if __name__ == "__main__":
    main()
