"""``strom bench grpc-records``: the record-level gRPC API (RecordService) next to the batch API.

One run measures, for the same records (``--records`` keyed records of ``--record-size``
bytes, ``--keys`` distinct keys), each on its own topic so every read phase reads exactly
what its write phase wrote:

* **batch API**: the Python ``Producer.send_batch`` in chunks of ``--batch`` records (it
  builds the record batches itself), then the Python ``Consumer.poll_arrow`` of up to
  ``--records-per-message`` records per poll (10,000), the size the Subscribe streams'
  messages get too, so both deliver records in pieces of the same size;
* **ProduceRecords** with ``--batch`` records per call and ``--in-flight`` calls outstanding,
  then **Subscribe**, from Python (generated stubs) and from Node.js (@grpc/grpc-js, the
  tests/node client) when ``node`` and ``tests/node/node_modules`` are there; the Node.js
  caller twice by default (``--node-route both``): calls spread over the nodes, which forward
  what they do not lead, and calls sent to each key's partition leader (the LeaderRouter of
  tests/node/lib/strom.js, docs/grpc-clients.md "Sending to the leader");
* **end-to-end latency** at ``--rate`` records/s, one record at a time: the Python client
  (``strom bench e2e``'s loop: Producer with linger 0, an assigned Consumer) against
  ProduceRecords (one record per call) + a Subscribe stream, from Python and from Node.js.

The goals of issue 14: ProduceRecords and Subscribe at >= 50 % of the batch API's records/s,
end-to-end latency within 2x of the Python client's. Numbers depend on what else runs on the
machine; the report says what the run saw, nothing is asserted.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from strom.api import records_pb2, records_pb2_grpc
from strom.bench import cpu
from strom.bench.clients import Progress, bench_consume, ensure_topic
from strom.bench.e2e import STAMP, bench_e2e
from strom.bench.stats import Result
from strom.grpc_options import DNS_OPTIONS

rp = records_pb2
#: The Node.js client of the tests (package.json, node_modules, bench_records.js).
NODE_DIR = Path(__file__).resolve().parents[3] / "tests" / "node"
_OPTIONS = [
    ("grpc.max_receive_message_length", 64 << 20),
    ("grpc.max_send_message_length", 64 << 20),
    # Calls spread over every node of the target (docs/grpc-clients.md, "Spreading calls"):
    # any node takes any call, and one node parsing every call is the bottleneck otherwise.
    ("grpc.lb_policy_name", "round_robin"),
    # A node restarted at a new IP under its name found within a second (grpc_options).
    *DNS_OPTIONS,
]


def grpc_target(bootstrap: str) -> str:
    """A gRPC target naming every node of ``bootstrap`` (``ipv4:a:p,b:p``) for round-robin
    calls; a single address (or host names, which ``ipv4:`` cannot take) as it is."""
    addresses = [a.strip() for a in bootstrap.split(",") if a.strip()]
    hosts = [a.rsplit(":", 1)[0] for a in addresses]
    if len(addresses) > 1 and all(
        h.count(".") == 3 and h.replace(".", "").isdigit() for h in hosts
    ):
        return "ipv4:" + ",".join(addresses)
    return addresses[0]


def _records(start: int, n: int, keys: int, size: int) -> tuple[list[bytes], list[bytes]]:
    value = b"x" * size
    return [b"key-%d" % (i % keys) for i in range(start, start + n)], [value] * n


def bench_batch_produce(
    bootstrap: str, topic: str, *, records: int, size: int, keys: int, batch: int
) -> Result:
    """The batch API: Producer.send_batch of keyed records, ``batch`` per call, acks=all."""
    from strom.client.producer import Producer

    with Producer(bootstrap, acks="all", linger_ms=0) as p:
        p.send_batch(topic, [b"warm"], [b"key-0"]).result(30)
        futures = []
        meter = cpu.start()
        start = time.perf_counter()
        for first in range(0, records, batch):
            ks, vs = _records(first, min(batch, records - first), keys, size)
            futures.append(p.send_batch(topic, vs, ks))
        for f in futures:
            f.result(120)
        seconds = time.perf_counter() - start
        usage = meter.stop()
    return Result(
        "batch API produce (Py)", len(futures), records, records * size, seconds, [], usage
    )


def bench_produce_records(
    address: str,
    topic: str,
    *,
    records: int,
    size: int,
    keys: int,
    batch: int,
    in_flight: int,
    progress: bool | None = None,
) -> Result:
    """ProduceRecords from the generated Python stubs: ``batch`` records per call,
    ``in_flight`` calls outstanding; latencies are per call."""
    bar = Progress(records, "ProduceRecords", enabled=progress)
    latencies: list[float] = []
    with grpc.insecure_channel(address, options=_OPTIONS) as ch:
        stub = records_pb2_grpc.RecordServiceStub(ch)
        warm = rp.ProduceRecordsRequest(topic=topic, records=rp.RecordColumns(values=[b"warm"]))
        stub.ProduceRecords(warm, timeout=30)
        sem = threading.Semaphore(in_flight)
        errors: list[str] = []
        futures: list[Future[Any]] = []
        meter = cpu.start()
        start = time.perf_counter()
        for first in range(0, records, batch):
            n = min(batch, records - first)
            ks, vs = _records(first, n, keys, size)
            req = rp.ProduceRecordsRequest(
                topic=topic, records=rp.RecordColumns(keys=ks, values=vs)
            )
            sem.acquire()
            t0 = time.perf_counter()
            fut = stub.ProduceRecords.future(req, timeout=120)

            def done(f: Any, t0: float = t0) -> None:
                latencies.append(time.perf_counter() - t0)
                try:
                    resp = f.result()
                    bad = [r for r in resp.results if r.error_code]
                    if resp.error_code or bad:
                        errors.append(resp.error_message or bad[0].error_message)
                except grpc.RpcError as exc:
                    errors.append(f"{exc.code().name}: {exc.details()}")
                finally:
                    sem.release()

            fut.add_done_callback(done)
            futures.append(fut)
            bar.update(first + n)
        for f in futures:
            f.exception()
        seconds = time.perf_counter() - start
        usage = meter.stop()
    bar.finish()
    if errors:
        raise RuntimeError(f"ProduceRecords failed {len(errors)} times, first: {errors[0]}")
    return Result(
        "ProduceRecords (Py)", len(futures), records, records * size, seconds, latencies, usage
    )


def bench_subscribe(address: str, topic: str, *, records: int, per_message: int = 1000) -> Result:
    """Subscribe from the earliest offset with the Python stubs until ``records`` arrived,
    up to ``per_message`` records per stream message."""
    got = nbytes = messages = 0
    meter = cpu.start()  # from the call: the node's work starts before the first message
    with grpc.insecure_channel(address, options=_OPTIONS) as ch:
        stream = records_pb2_grpc.RecordServiceStub(ch).Subscribe(
            rp.SubscribeRequest(
                topics=[topic],
                start=rp.START_POSITION_EARLIEST,
                max_records_per_message=per_message,
            ),
            timeout=600,
        )
        start = None
        try:
            for msg in stream:
                if msg.WhichOneof("event") != "records":
                    continue
                if start is None:
                    start = time.perf_counter()
                n = len(msg.records.offsets)
                got += n
                messages += 1
                nbytes += sum(map(len, msg.records.records.values))
                if got >= records:
                    break
        finally:
            stream.cancel()
    seconds = time.perf_counter() - (start or time.perf_counter())
    return Result("Subscribe (Py)", messages, got, nbytes, seconds, [], meter.stop())


def bench_grpc_e2e(address: str, topic: str, *, records: int, size: int, rate: float) -> Result:
    """End-to-end latency through RecordService: one record per ProduceRecords call at
    ``rate``, received on a Subscribe stream (latest) opened first."""
    latencies: list[float] = []
    pad = b"x" * max(size - STAMP.size, 0)
    got = [0]
    arrived = threading.Condition()
    with grpc.insecure_channel(address, options=_OPTIONS) as ch:
        stub = records_pb2_grpc.RecordServiceStub(ch)
        stream = stub.Subscribe(rp.SubscribeRequest(topics=[topic]), timeout=records / rate + 90)
        first = next(stream)  # the assignment: sent once "latest" is resolved
        assert first.WhichOneof("event") == "assignment"

        def receive() -> None:
            try:
                for msg in stream:
                    now = time.perf_counter_ns()
                    if msg.WhichOneof("event") != "records":
                        continue
                    for v in msg.records.records.values:
                        latencies.append((now - STAMP.unpack_from(v)[2]) / 1e9)
                    with arrived:
                        got[0] += len(msg.records.offsets)
                        arrived.notify_all()
            except grpc.RpcError:
                pass  # cancelled below (or the deadline)

        reader = threading.Thread(target=receive, daemon=True)
        reader.start()
        meter = cpu.start()
        start = time.perf_counter()
        futures = []
        for i in range(records):
            ahead = i / rate - (time.perf_counter() - start)
            if ahead > 0:
                time.sleep(ahead)
            value = STAMP.pack(0, i, time.perf_counter_ns()) + pad
            req = rp.ProduceRecordsRequest(topic=topic, records=rp.RecordColumns(values=[value]))
            futures.append(stub.ProduceRecords.future(req, timeout=60))
        acked = sum(1 for f in futures if f.exception() is None)
        with arrived:
            arrived.wait_for(lambda: got[0] >= acked, timeout=60)
        seconds = time.perf_counter() - start
        usage = meter.stop()
        stream.cancel()
        reader.join(10)
    return Result("end-to-end gRPC (Py)", None, got[0], got[0] * size, seconds, latencies, usage)


def _wait_known(target: str, topics: list[str], timeout_s: float = 30.0) -> None:
    """Until every node the gRPC callers use knows every topic and its leaders (a node's
    etcd view may lag a topic just created)."""
    from strom.api import storage_pb2, storage_pb2_grpc
    from strom.devcluster.procs import wait_for

    for address in target.removeprefix("ipv4:").split(","):
        with grpc.insecure_channel(address) as ch:
            stub = storage_pb2_grpc.StorageServiceStub(ch)

            def known(stub: storage_pb2_grpc.StorageServiceStub = stub) -> bool:
                md = stub.Metadata(storage_pb2.MetadataRequest(topics=topics), timeout=5)
                return all(
                    t.error_code == 0 and t.partitions and all(p.leader >= 0 for p in t.partitions)
                    for t in md.topics
                )

            wait_for(known, timeout=timeout_s, what=f"{address} to know the bench topics")


def node_available() -> bool:
    return shutil.which("node") is not None and (NODE_DIR / "node_modules" / "@grpc").is_dir()


def bench_node(
    address: str,
    topic: str | None,
    *,
    records: int,
    size: int,
    keys: int,
    batch: int,
    in_flight: int,
    latency_topic: str | None,
    latency_records: int,
    rate: float,
    route: str = "any",
    per_message: int = 1000,
) -> list[Result]:
    """Run tests/node/bench_records.js and turn its JSON line into Results. ``route``:
    ``any`` (calls to ``address``; the nodes forward what they do not lead) or ``leaders``
    (each record to its partition's leader, the script's LeaderRouter; results named
    "(Node, to leaders)")."""
    argv = [
        "node",
        str(NODE_DIR / "bench_records.js"),
        "--address",
        address,
        "--records",
        str(records if topic else 0),
        "--record-size",
        str(size),
        "--keys",
        str(keys),
        "--batch",
        str(batch),
        "--in-flight",
        str(in_flight),
        "--route",
        route,
        "--max-records-per-message",
        str(per_message),
    ]
    if topic:
        argv += ["--topic", topic]
    if latency_topic:
        argv += [
            "--latency-topic",
            latency_topic,
            "--latency-records",
            str(latency_records),
            "--rate",
            str(rate),
        ]
    proc = subprocess.run(argv, cwd=NODE_DIR, capture_output=True, text=True, timeout=1800)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"the Node.js bench failed: {proc.stdout[-1000:]} {proc.stderr[-1000:]}")
    out = json.loads(lines[-1])
    who = "Node" if route == "any" else "Node, to leaders"
    results = []
    if "produce" in out:
        p, s = out["produce"], out["subscribe"]
        results.append(
            Result(f"ProduceRecords ({who})", None, p["records"], p["records"] * size, p["seconds"])
        )
        if route == "any":  # Subscribe is not routed: measured once
            results.append(Result("Subscribe (Node)", None, s["records"], s["bytes"], s["seconds"]))
    if "latency_ms" in out:
        lat = [x / 1e3 for x in out["latency_ms"]]
        results.append(
            Result(
                f"end-to-end gRPC ({who})", None, len(lat), len(lat) * size, len(lat) / rate, lat
            )
        )
    return results


def bench_grpc_records(
    bootstrap: str,
    topic: str,
    *,
    address: str | None = None,
    records: int = 200_000,
    size: int = 100,
    keys: int = 1000,
    batch: int = 1000,
    in_flight: int = 4,
    partitions: int = 6,
    replication_factor: int = 1,
    rate: float = 200.0,
    latency_records: int = 2000,
    node: bool | None = None,
    node_route: str = "both",
    per_message: int = 10_000,
    progress: bool | None = None,
) -> tuple[list[Result], dict[str, Any]]:
    """Every phase (see the module docstring); returns the results and the ratios."""
    address = address or grpc_target(bootstrap)
    use_node = node_available() if node is None else node
    if use_node and not node_available():
        raise RuntimeError(f"node or {NODE_DIR}/node_modules missing: run scripts/bootstrap.sh")
    if node_route not in ("any", "leaders", "both"):
        raise ValueError(f"node_route must be any, leaders or both, not {node_route!r}")
    routes = ["any", "leaders"] if node_route == "both" else [node_route]
    names = {k: f"{topic}-{k}" for k in ("batch", "grpc-py", "grpc-node", "grpc-node-leaders")}
    lat_names = {k: f"{topic}-lat-{k}" for k in ("py", "grpc-py", "grpc-node", "grpc-node-leaders")}
    for name in names.values():
        ensure_topic(bootstrap, name, partitions, replication_factor)
    for name in lat_names.values():
        ensure_topic(bootstrap, name, 1, replication_factor)
    _wait_known(address, [*names.values(), *lat_names.values()])
    shape = dict(records=records, size=size, keys=keys, batch=batch)
    results = [bench_batch_produce(bootstrap, names["batch"], **shape)]
    results.append(
        bench_produce_records(
            address, names["grpc-py"], in_flight=in_flight, progress=progress, **shape
        )
    )
    results.append(
        bench_consume(
            bootstrap, names["batch"], records=records + 1, api="arrow", poll_records=per_message
        )[0]
    )
    results[-1].name = "batch API consume (Py)"
    results.append(
        bench_subscribe(address, names["grpc-py"], records=records + 1, per_message=per_message)
    )
    node_results: list[Result] = []
    if use_node:
        for route in routes:
            suffix = "" if route == "any" else "-leaders"
            node_results += bench_node(
                address,
                names["grpc-node" + suffix],
                in_flight=in_flight,
                latency_topic=lat_names["grpc-node" + suffix],
                latency_records=latency_records,
                rate=rate,
                route=route,
                per_message=per_message,
                **shape,
            )
        results += [r for r in node_results if not r.name.startswith("end-to-end")]
    py_e2e = bench_e2e(
        bootstrap,
        lat_names["py"],
        records=latency_records,
        record_size=size,
        rate=rate,
        acks="all",
        linger_ms=0,
        warmup_records=0,  # as the gRPC callers: their first records count too
        lead_in_s=0,
    )
    py_e2e.name = "end-to-end client (Py)"
    results.append(py_e2e)
    results.append(
        bench_grpc_e2e(address, lat_names["grpc-py"], records=latency_records, size=size, rate=rate)
    )
    results += [r for r in node_results if r.name.startswith("end-to-end")]
    return results, ratios(results)


def ratios(results: list[Result]) -> dict[str, Any]:
    """records/s of each gRPC phase over the batch API's, and p50/p99 latency over the
    Python client's."""
    by = {r.name: r for r in results}

    def rate(name: str) -> float:
        r = by[name]
        return r.records / max(r.seconds, 1e-9)

    out: dict[str, Any] = {}
    for caller in CALLERS:
        if f"ProduceRecords ({caller})" in by:
            out[f"produce_{_slug(caller)}_vs_batch"] = round(
                rate(f"ProduceRecords ({caller})") / rate("batch API produce (Py)"), 2
            )
        if f"Subscribe ({caller})" in by:
            out[f"subscribe_{_slug(caller)}_vs_batch"] = round(
                rate(f"Subscribe ({caller})") / rate("batch API consume (Py)"), 2
            )
    base = by.get("end-to-end client (Py)")
    if base is not None and base.latencies:
        b50, b99 = np.percentile(np.asarray(base.latencies), [50, 99])
        for caller in CALLERS:
            r = by.get(f"end-to-end gRPC ({caller})")
            if r is not None and r.latencies:
                p50, p99 = np.percentile(np.asarray(r.latencies), [50, 99])
                out[f"e2e_{_slug(caller)}_p50_vs_client"] = round(float(p50 / b50), 2)
                out[f"e2e_{_slug(caller)}_p99_vs_client"] = round(float(p99 / b99), 2)
    return out


#: The gRPC callers of a run, as their results name them.
CALLERS = ("Py", "Node", "Node, to leaders")


def _slug(caller: str) -> str:
    """ "Node, to leaders" -> "node_leaders" (the ratio keys)."""
    return caller.lower().replace(", to ", "_")
