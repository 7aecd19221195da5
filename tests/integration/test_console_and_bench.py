"""`strom produce` / `strom consume` in their full form and `strom bench produce|consume|e2e`,
as processes against a real one-node cluster."""

from __future__ import annotations

import array
import fcntl
import json
import signal
import subprocess
import sys
import termios
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from strom.client import Admin
from strom.client.consumer import Consumer
from strom.client.producer import Producer
from strom.client.types import TopicPartition
from strom.devcluster.cluster import LocalCluster
from strom.devcluster.procs import wait_for

from .test_cluster_cli import strom

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def local(one_node_cluster: LocalCluster) -> LocalCluster:
    # As `strom dev up` leaves it: the bench finds the metrics endpoints in the state file.
    one_node_cluster.save_state()
    with Admin(one_node_cluster.bootstrap) as admin:
        admin.create_topic("lines", partitions=2, replication_factor=1)
        admin.create_topic("keyed", partitions=1, replication_factor=1)
    return one_node_cluster


@pytest.fixture(scope="module")
def bootstrap(local: LocalCluster) -> str:
    return local.bootstrap


def test_produce_with_keys_headers_acks_and_compression(bootstrap: str) -> None:
    out = strom(
        "produce",
        "lines",
        "-b",
        bootstrap,
        "--key-separator",
        ":",
        "--header",
        "source=test",
        "--header",
        "v=2",
        "--acks",
        "all",
        "--compression",
        "zstd",
        stdin=b"alice:one\nbob:two\nalice:three\n",
    )
    assert b"produced 3 records" in out.stderr
    printed = strom(
        "consume",
        "lines",
        "-b",
        bootstrap,
        "--from-beginning",
        "--max-messages",
        "3",
        "--format",
        "{key}={value} [{headers}] p{partition}",
    ).stdout.decode()
    lines = sorted(printed.splitlines())
    assert [line.split(" [")[0] for line in lines] == ["alice=one", "alice=three", "bob=two"]
    assert all("[source=test,v=2]" in line for line in lines)
    alice = {line.rsplit(" ", 1)[1] for line in lines if line.startswith("alice")}
    assert len(alice) == 1  # one key, one partition


def test_console_errors_are_clear(bootstrap: str) -> None:
    bad = strom("produce", "nope", "-b", bootstrap, stdin=b"x\n", check=False)
    assert bad.returncode != 0 and b"unknown topic 'nope'" in bad.stderr
    assert b"Traceback" not in bad.stderr
    bad = strom("consume", "lines", "-b", bootstrap, "--format", "{nope}", check=False)
    assert bad.returncode != 0 and b"bad --format" in bad.stderr
    assert b"(ValueError)" not in bad.stderr  # the message says what was wrong; no type name
    bad = strom("produce", "lines", "-b", bootstrap, "--header", "novalue", check=False)
    assert bad.returncode != 0 and b"NAME=VALUE" in bad.stderr
    # A line without the key separator stops the command naming it, as Kafka's console
    # producer does (it became a record with no key); the lines before it are sent.
    bad = strom(
        "produce",
        "keyed",
        "-b",
        bootstrap,
        "--key-separator",
        ":",
        stdin=b"k1:one\nno separator\nk3:three\n",
        check=False,
    )
    assert bad.returncode != 0 and b"line 2 has no key separator ':'" in bad.stderr
    assert b"the 1 record before it were sent" in bad.stderr
    printed = strom(
        "consume",
        "keyed",
        "-b",
        bootstrap,
        "--from-beginning",
        "--timeout-ms",
        "1500",
        "--print-key",
        "--key-separator",
        "=",
    ).stdout
    assert printed == b"k1=one\n"
    for flags, message in [
        (["--max-messages", "0"], b"--max-messages: must be at least 1"),
        (["--timeout-ms", "-1"], b"--timeout-ms: must be at least 0"),
        (["--key-separator", ""], b"--key-separator: must not be empty"),
    ]:
        bad = strom("consume", "keyed", "-b", bootstrap, *flags, check=False)
        assert bad.returncode == 2 and message in bad.stderr, bad.stderr


def test_consume_prints_each_timestamp_with_its_type(bootstrap: str) -> None:
    """`--print-timestamp` starts a line with Kafka's TYPE:MILLISECONDS column (CreateTime:
    the producer's, LogAppendTime: the leader's) and `--format` has {timestamp_type}; a
    `--format` with `--print-key` or `--print-timestamp` is refused (the flag was ignored)."""
    with Admin(bootstrap) as admin:
        admin.create_topic("created-ts", partitions=1, replication_factor=1)
        admin.create_topic("appended-ts", 1, 1, config={"message.timestamp.type": "LogAppendTime"})
    now_ms = int(time.time() * 1000)
    with Producer(bootstrap) as p:
        p.send("created-ts", b"v1", key=b"k1", timestamp_ms=now_ms - 5_000).result(timeout=30)
        appended = p.send("appended-ts", b"v2", timestamp_ms=1_000).result(timeout=30)
    assert appended.timestamp > now_ms - 60_000  # the leader's clock, not the 1,000 sent

    def consume(topic: str, *flags: str) -> bytes:
        return strom(
            "consume", topic, "-b", bootstrap, "--from-beginning", "--max-messages", "1", *flags
        ).stdout

    assert consume("created-ts", "--print-timestamp", "--print-key") == (
        b"CreateTime:%d\tk1\tv1\n" % (now_ms - 5_000)
    )
    assert consume("appended-ts", "--print-timestamp") == (
        b"LogAppendTime:%d\tv2\n" % appended.timestamp
    )
    assert consume("appended-ts", "--format", "{timestamp_type}@{timestamp}") == (
        b"LogAppendTime@%d\n" % appended.timestamp
    )
    for flag in ("--print-timestamp", "--print-key"):
        bad = strom(
            "consume", "created-ts", "-b", bootstrap, "--format", "{value}", flag, check=False
        )
        assert bad.returncode == 2 and b"--format prints only what it names" in bad.stderr
        assert b"Traceback" not in bad.stderr


def test_a_reader_closing_the_pipe_ends_the_command_quietly(bootstrap: str) -> None:
    """`strom topics describe t | head -1`: the reader goes away before the command writes;
    the command stops without an error line (it printed "[Errno 32] Broken pipe")."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "strom.cli.main", "topics", "describe", "lines", "-b", bootstrap],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # before the command has connected, let alone written
    err = proc.stderr.read()
    assert proc.wait(timeout=60) == 0
    assert err == b""


def test_sigterm_makes_the_group_consumer_leave_its_group(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    """`strom consume --group` stopped with SIGTERM (a container stop, a supervisor) leaves
    its group as Ctrl-C makes it do, instead of dying in place and staying a member until the
    session timeout (found from outside). The coordinator's session timeout is 10 minutes
    here, so only a leave can empty the group within the test."""
    c = make_cluster(
        nodes=1,
        controllers=1,
        coordinators=1,
        coordinator_args=[
            "--group-session-timeout-ms",
            "600000",
            "--group-heartbeat-interval-ms",
            "200",
            "--offsets-partitions",
            "1",
        ],
    )
    with Admin(c.bootstrap) as admin:
        admin.create_topic("termed", partitions=2, replication_factor=1)

    def members() -> list[dict]:
        got = strom("groups", "describe", "g-term", "--json", "-b", c.bootstrap, check=False)
        return json.loads(got.stdout)["members"] if got.returncode == 0 else [{"unknown": 1}]

    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "strom.cli.main",
            "consume",
            "termed",
            "--group",
            "g-term",
            "-b",
            c.bootstrap,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        wait_for(
            lambda: [m["member_epoch"] > 0 for m in members()] == [True],
            timeout=60,
            what="the console consumer joining its group",
        )
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM
        assert proc.stderr is not None and b"Traceback" not in proc.stderr.read()
        wait_for(lambda: members() == [], timeout=20, what="the member leaving the group")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _blocked_reading_stdin(proc: subprocess.Popen[bytes]) -> bool:
    """The command consumed every line written to its stdin pipe and waits in read() for
    more: Python's buffered readline calls read() only once the lines it holds are used up,
    so every line written so far has been handed to send()."""
    assert proc.stdin is not None
    pending = array.array("i", [0])
    fcntl.ioctl(proc.stdin.fileno(), termios.FIONREAD, pending)  # bytes still in the pipe
    wchan = Path(f"/proc/{proc.pid}/wchan").read_text()
    return pending[0] == 0 and wchan.endswith("pipe_read")  # (anon_)pipe_read by kernel


def test_sigterm_makes_the_console_producer_send_what_it_read(local: LocalCluster) -> None:
    """`strom produce` stopped with SIGTERM while records wait in its buffer (a long linger,
    stdin still open) sends them before it ends, as at end of input; they were dropped
    (found while fixing the consumer's SIGTERM)."""
    with Admin(local.bootstrap) as admin:
        admin.create_topic("termed-produce", partitions=1, replication_factor=1)
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "strom.cli.main", "produce", "termed-produce"),
            *("--linger-ms", "600000", "-b", local.bootstrap),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        assert proc.stdin is not None
        proc.stdin.write(b"".join(b"line-%d\n" % i for i in range(50)))
        proc.stdin.flush()
        wait_for(lambda: _blocked_reading_stdin(proc), timeout=30, what="all lines read")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM
        assert proc.stderr is not None and b"Traceback" not in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    tp = TopicPartition("termed-produce", 0)
    with Consumer(local.bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([tp])
        values: list[bytes] = []
        wait_for(
            lambda: (
                values.extend(r.value for r in consumer.poll(timeout_ms=200)) or len(values) >= 50
            ),
            timeout=30,
            what="the 50 records",
        )
    assert values == [b"line-%d" % i for i in range(50)]


@pytest.mark.parametrize(
    ("mode", "extra"),
    [
        ("produce", ["--api", "send", "--acks", "all"]),
        ("produce", ["--api", "batch", "--compression", "lz4"]),
        ("produce", ["--api", "send", "--keys", "10"]),
        ("consume", ["--api", "poll"]),
        ("consume", ["--api", "arrow"]),
        ("consume", ["--api", "arrow", "--max-partition-fetch-bytes", "4MiB"]),
        ("e2e", ["--rate", "5000"]),
        ("e2e", ["--rate", "5000", "--trace"]),
        ("e2e", ["--rate", "5000", "--consumer-process"]),
        ("e2e", ["--rate", "5000", "--consumer-process", "--group", "bench-proc"]),
        ("e2e", ["--rate", "5000", "--lead-in", "0"]),
    ],
)
def test_bench_modes_report_json(local: LocalCluster, mode: str, extra: list[str]) -> None:
    """Every result carries the client's and the servers' CPU per million records: the
    servers' from --metrics, or (consume) found through the `strom dev up` state file."""
    bootstrap = local.bootstrap
    if mode == "consume":
        env = {"STROM_DEV_DIR": str(local.root)}
    else:
        env = {"STROM_DEV_DIR": str(local.root / "absent")}
        urls = ",".join(f"127.0.0.1:{m.metrics_port}" for m in local.members)
        extra = [*extra, "--metrics", urls]
    out = strom(
        "bench",
        mode,
        "-b",
        bootstrap,
        "--topic",
        "bench",
        "--records",
        "3000",
        "--json",
        *extra,
        timeout=120,
        env=env,
    )
    report = json.loads(out.stdout)
    (result,) = report["results"]
    assert result["records"] == 3000
    assert result["client_cpu_s"] > 0 and result["client_cpu_s_per_M_records"] > 0
    # The servers' counters move in whole clock ticks (10 ms): a 3,000-record batch phase can
    # cost three nodes less than one tick, so a zero is a real reading; None would be a miss.
    assert result["server_cpu_s"] is not None and result["server_cpu_s"] >= 0
    assert result["server_cpu_s_per_M_records"] is not None
    assert "metrics http://127.0.0.1:" in report["context"]["server_cpu"]
    assert result["records_per_s"] > 0 and result["mb_per_s"] > 0
    assert {"p50_ms", "p99_ms", "p99.9_ms"} <= set(result)
    assert report["context"]["mode"] == mode
    if "--max-partition-fetch-bytes" in extra:
        assert report["context"]["max_partition_fetch_bytes"] == 4 << 20
    if mode == "e2e":  # every record accounted for
        assert (result["sent"], result["failed"], result["lost"], result["duplicates"]) == (
            3000,
            0,
            0,
            0,
        )
        # Latency counts from each record's scheduled time, and a record is never sent
        # before it: so never less than the latency from its send() call.
        for q in ("p50", "p99", "p99.9"):
            assert result[f"{q}_ms"] >= result[f"from_send_{q}_ms"] > 0
        # The machine's prices, measured before the run, travel with the result.
        machine = result["machine"]
        for k in ("grpc_round_trip", "thread_handoff"):
            assert 0 < machine[f"{k}_p50_us"] <= machine[f"{k}_p99_us"]
        assert machine["python_loop_ms"] > 0
        proc = "--consumer-process" in extra
        assert report["context"]["consumer"] == ("process" if proc else "thread")
        # The lead-in (records sent at the rate before the measured ones) is neither counted
        # nor measured: "records" above is the measured 3,000 either way.
        assert report["context"]["lead_in_s"] == (0 if "--lead-in" in extra else 0.3)
        if "--group" in extra:  # the receiving process committed as it went
            assert result["commits"] > 0 and result["commit_errors"] == 0
    else:  # produce and consume: the machine's prices in the context line
        assert report["context"]["machine"].startswith("gRPC ")
    # What send(), or poll() and its loop, cost the application's own thread.
    if (mode == "produce" and "send" in extra) or mode == "consume":
        assert result["caller_cpu_us_per_record"] > 0
    else:
        assert "caller_cpu_us_per_record" not in result
    if "--trace" in extra:  # each leg of the way, in order, within the total
        budget = result["budget_ms"]
        assert len(budget) == 5
        total = budget["send() -> poll() returns it (total)"]
        for leg, q in budget.items():
            assert 0 <= q["p50"] <= q["p99"] <= q["p99.9"], leg
            assert q["p50"] <= total["p99.9"], leg
        assert total["p50"] > 0
    else:
        assert "budget_ms" not in result


def test_bench_grpc_puts_the_node_beside_bare_calls_and_stream_messages(
    local: LocalCluster,
) -> None:
    """`strom bench grpc`: the node's Produce/Fetch and the bare echo server's calls, with
    the upload also as messages on open streams (what a call costs beyond a message)."""
    bootstrap = local.bootstrap
    strom(
        "bench", "produce", "-b", bootstrap, "--topic", "grpc-bench", "--records", "10", timeout=60
    )
    out = strom(
        "bench",
        "grpc",
        "-b",
        bootstrap,
        "--topic",
        "grpc-bench",
        "--batch-size",
        "64KiB",
        "--total",
        "4MiB",
        "--concurrency",
        "2",
        "--json",
        timeout=120,
    )
    report = json.loads(out.stdout)
    rows = {r["name"]: r for r in report["results"]}
    assert set(rows) >= {
        "echo upload",
        "echo upload (stream)",
        "echo download",
        "echo upload + write",
    }
    for name in ("echo upload", "echo upload (stream)", "echo upload + write"):
        assert rows[name]["batches"] == 64, name  # 4 MiB in 64 KiB messages
        assert rows[name]["bytes"] == 4 << 20, name
        assert rows[name]["p50_ms"] > 0, name
    node_rows = [r for name, r in rows.items() if not name.startswith("echo")]
    assert len(node_rows) == 2 and all(r["bytes"] > 0 for r in node_rows)


@pytest.mark.parametrize("commit", ["sync", "async"])
def test_bench_consume_as_a_group_commits_after_every_poll(
    local: LocalCluster, commit: str
) -> None:
    """`--group G --commit sync|async --poll-records N`: a commit per poll, each timed, and the
    group's committed offsets end at what was consumed."""
    bootstrap = local.bootstrap
    topic, group = f"bench-commit-{commit}", f"bench-commit-{commit}-g"
    strom("bench", "produce", "-b", bootstrap, "--topic", topic, "--records", "3000", timeout=120)
    out = strom(
        "bench",
        "consume",
        "-b",
        bootstrap,
        "--topic",
        topic,
        "--records",
        "3000",
        "--poll-records",
        "500",
        "--group",
        group,
        "--commit",
        commit,
        "--json",
        timeout=120,
    )
    report = json.loads(out.stdout)
    consumed, commits = report["results"]
    assert consumed["records"] == 3000
    assert commits["name"] == f"commit ({commit})"
    # One commit per poll of at most 500 records: at least 6 (async ones merge in the client's
    # queue but each is timed to its callback).
    assert commits["batches"] == consumed["batches"] >= 6
    assert commits["p50_ms"] > 0
    assert (report["context"]["group"], report["context"]["commit"]) == (group, commit)
    with Admin(bootstrap) as admin:
        count = len(admin.describe_topic(topic).partitions)
    with Consumer(bootstrap, group_id=group) as c:
        committed = c.committed([TopicPartition(topic, p) for p in range(count)])
    assert sum(o.offset for o in committed.values() if o is not None) == 3000


def test_bench_says_what_it_did_not_measure(local: LocalCluster) -> None:
    """Found from outside: `bench produce` printed a made-up "0 batches/s"; `bench consume` on
    a missing topic created it and reported 0 records/s, and on a topic holding fewer records
    than --records it waited, reported what there was and exited 0; --partitions for an
    existing topic was ignored without a word."""
    b, topic = local.bootstrap, "bench-truth"
    made = strom("bench", "produce", "-b", b, "--topic", topic, "--partitions", "2",
                 "--records", "200", timeout=120)  # fmt: skip
    line = next(x for x in made.stdout.decode().splitlines() if x.startswith("produce"))
    assert " - batches/s" in line and " 0 batches/s" not in line
    again = strom("bench", "produce", "-b", b, "--topic", topic, "--partitions", "3",
                  "--records", "100", "--json", timeout=120)  # fmt: skip
    assert json.loads(again.stdout)["results"][0]["batches"] is None
    assert b"already exists with 2 partitions: --partitions 3 applies to a new topic" in (
        again.stderr
    )
    missing = strom("bench", "consume", "-b", b, "--topic", "bench-nosuch", "--records", "100",
                    check=False)  # fmt: skip
    assert missing.returncode == 1 and b"topic 'bench-nosuch' does not exist" in missing.stderr
    with Admin(b) as admin:
        assert "bench-nosuch" not in admin.list_topics()
    # Each produce run sends one warm-up record before the measured ones: 302 in all.
    short = strom("bench", "consume", "-b", b, "--topic", topic, "--records", "303",
                  check=False)  # fmt: skip
    assert short.returncode == 1, short.stderr
    assert b"holds 302 records, fewer than --records 303" in short.stderr
    # A group that committed everything finds nothing to read: it says so after its 10 s.
    group = ["--group", "bench-truth-g", "--commit", "sync"]
    strom("bench", "consume", "-b", b, "--topic", topic, "--records", "302", *group,
          timeout=120)  # fmt: skip
    drained = strom("bench", "consume", "-b", b, "--topic", topic, "--records", "10", *group,
                    check=False, timeout=120)  # fmt: skip
    assert drained.returncode == 1
    assert b"read 0 of the 10 records asked for" in drained.stderr


def test_bench_transactional_interleaves_rounds_and_reports_medians(local: LocalCluster) -> None:
    """``strom bench produce --transactional --rounds 2``: the baseline and each transaction
    size run twice, interleaved; each phase reports its median round, commit latencies and
    the rounds' rates."""
    out = strom(
        "bench",
        "produce",
        "-b",
        local.bootstrap,
        "--topic",
        "bench-txn",
        "--records",
        "2000",
        "--transactional",
        "--transaction-size",
        "500",
        "--rounds",
        "2",
        "--json",
        timeout=180,
        env={"STROM_DEV_DIR": str(local.root / "absent")},
    )
    report = json.loads(out.stdout)
    base, txn = report["results"]
    assert base["name"] == "idempotent" and txn["name"] == "txn of 500 (commit)"
    assert base["records"] == txn["records"] == 2000
    assert txn["batches"] == 4 and txn["p50_ms"] > 0  # four commits, their latencies
    rounds = report["context"]["round_records_per_s"]
    assert set(rounds) == {"idempotent", "txn of 500 (commit)"}
    assert all(len(r) == 2 and min(r) > 0 for r in rounds.values())
    # The reported phase is one of its rounds (the median; the lower of two).
    lower = min(rounds["txn of 500 (commit)"])
    assert abs(txn["records_per_s"] - lower) <= 1


def test_consume_as_a_group_resumes_after_its_commits(bootstrap: str) -> None:
    with Admin(bootstrap) as admin:
        admin.create_topic("grouped", partitions=2, replication_factor=1)
    strom("produce", "grouped", "-b", bootstrap, stdin=b"".join(b"r%d\n" % i for i in range(6)))
    first = strom(
        "consume",
        "grouped",
        "-b",
        bootstrap,
        "--group",
        "cli",
        "--from-beginning",
        "--max-messages",
        "6",
        timeout=90,
    ).stdout.split()
    assert sorted(first) == [b"r%d" % i for i in range(6)]
    strom("produce", "grouped", "-b", bootstrap, stdin=b"late\n")
    again = strom(
        "consume",
        "grouped",
        "-b",
        bootstrap,
        "--group",
        "cli",
        "--from-beginning",
        "--max-messages",
        "1",
        timeout=90,
    ).stdout.split()
    assert again == [b"late"]  # the group's committed offsets, not --from-beginning, decide


def test_bench_tls_measures_both_clusters_in_one_run(tmp_path: Path) -> None:
    """`strom bench tls` starts a plaintext and an mTLS cluster, runs every phase on each
    and reports TLS against plaintext; every e2e record is accounted for on both."""
    out = strom(
        "bench",
        "tls",
        "--nodes",
        "1",
        "--replication-factor",
        "1",
        "--partitions",
        "1",
        "--records",
        "2000",
        "--e2e-records",
        "500",
        "--rate",
        "2000",
        "--dir",
        str(tmp_path),
        "--json",
        timeout=300,
    )
    report = json.loads(out.stdout)
    names = [r["name"] for r in report["results"]]
    assert sorted(names) == sorted(
        f"{m} {p}" for m in ("plaintext", "tls") for p in ("produce", "fetch", "e2e")
    )
    for r in report["results"]:
        assert r["records_per_s"] > 0
        # The clusters' own processes are measured (/proc counts CPU in 10 ms ticks, so a
        # phase this short may cost a node less than one tick: >= 0 each, > 0 in sum).
        assert r["client_cpu_s_per_M_records"] > 0 and r["server_cpu_s_per_M_records"] >= 0
        if r["name"].endswith("e2e"):
            assert (r["sent"], r["failed"], r["lost"], r["duplicates"]) == (500, 0, 0, 0)
        else:
            assert r["records"] == 2000
    assert sum(r["server_cpu_s"] for r in report["results"]) > 0
    ctx = report["context"]
    assert ctx["mode"] == "tls"
    for phase in ("produce", "fetch", "e2e"):
        assert ctx[f"{phase}_tls_share"] > 0
        assert ctx[f"{phase}_tls_p99_ms"] >= ctx[f"{phase}_tls_p50_ms"] > 0


def test_bench_startup_restarts_a_node_holding_its_log(tmp_path: Path) -> None:
    """`strom bench startup`: a node holding the written log restarted after SIGKILL and after
    SIGTERM, each timed to serving and to leading its partitions again."""
    out = strom(
        "bench",
        "startup",
        "--gib",
        "0.02",
        "--partitions",
        "2",
        "--dir",
        str(tmp_path),
        "--json",
        timeout=180,
    )
    report = json.loads(out.stdout.strip().splitlines()[-1])
    rows = report["restarts"]
    assert [r["stop"] for r in rows] == ["SIGKILL", "SIGTERM"]
    for r in rows:
        assert r["partitions"] == 2 and r["gib"] >= 0.02
        assert 0 < r["serving_s"] <= r["leading_s"]
    assert report["context"] == {"mode": "startup", "gib": 0.02, "partitions": 2}


def test_bench_commits_counts_appends_per_commit_in_both_modes(tmp_path: Path) -> None:
    """`strom bench commits --compare`: each mode on its own cluster; with one append per
    commit the coordinator's appends equal the commits, batched they are never more."""
    out = strom(
        "bench",
        "commits",
        "--committers",
        "8",
        "--seconds",
        "1",
        "--partitions",
        "2",
        "--compare",
        "--dir",
        str(tmp_path),
        "--json",
        timeout=300,
    )
    report = json.loads(out.stdout)
    by_name = {r["name"]: r for r in report["results"]}
    assert sorted(by_name) == ["batched, 8 committers", "one-per-append, 8 committers"]
    ctx = report["context"]
    assert ctx["batched_failed_commits"] == 0 and ctx["one-per-append_failed_commits"] == 0
    single = by_name["one-per-append, 8 committers"]
    assert single["records"] > 0 and single["batches"] == single["records"]
    assert ctx["one-per-append_commits_per_append"] == 1.0
    batched = by_name["batched, 8 committers"]
    assert 0 < batched["batches"] <= batched["records"]
    assert batched["p99_ms"] >= batched["p50_ms"] > 0
    assert batched["client_cpu_s_per_M_records"] > 0
    assert list(tmp_path.iterdir()) == [], "the clusters' directories were left behind"


def _blocked_writing_stdout(proc: subprocess.Popen[bytes]) -> bool:
    """The command's main thread waits in write() because the pipe to its reader is full."""
    return Path(f"/proc/{proc.pid}/wchan").read_text().endswith("pipe_write")


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["sigint", "sigterm"])
def test_a_stopped_group_consumer_commits_only_what_it_printed(
    local: LocalCluster, stop: signal.Signals
) -> None:
    """`strom consume --group` stopped (Ctrl-C, SIGTERM) while its reader is slow and the
    pipe full: the group's next run starts at the first record the stopped one did not
    print. The records poll() had returned but the command had not yet written were
    committed as consumed on close, and the next run started after them (found from
    outside: hundreds of records missing per stop)."""
    topic = f"stopped-{stop.name.lower()}"
    per_partition = 2000
    with Admin(local.bootstrap) as admin:
        admin.create_topic(topic, partitions=2, replication_factor=1)
    value = b"v" * 100  # long lines: a poll's records fill the stdout buffer many times over
    with Producer(local.bootstrap) as producer:
        for _ in range(per_partition):
            for p in (0, 1):
                producer.send(topic, value, partition=p)
        producer.flush()
    command = [
        *(sys.executable, "-m", "strom.cli.main", "consume", topic, "-b", local.bootstrap),
        *("--group", f"g-{topic}", "--from-beginning", "--format", "{partition}:{offset}:{value}"),
    ]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        # Nobody reads yet: the command stops in write() once the pipe is full, mid-poll.
        wait_for(lambda: _blocked_writing_stdout(proc), timeout=60, what="a full stdout pipe")
        proc.send_signal(stop)
        first, err = proc.communicate(timeout=60)  # the reader catches up after the signal
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == (130 if stop == signal.SIGINT else 128 + stop), err
    assert b"Traceback" not in err
    assert first.endswith(b"\n")  # whole lines only
    again = strom(*command[3:], "--timeout-ms", "3000", timeout=90).stdout
    printed = [line.rsplit(b":", 1)[0] for line in (first + again).splitlines()]
    expected = [b"%d:%d" % (p, o) for p in (0, 1) for o in range(per_partition)]
    assert 0 < len(first.splitlines()) < len(expected)  # stopped mid-stream
    assert sorted(printed) == sorted(expected)  # none missing, none twice
