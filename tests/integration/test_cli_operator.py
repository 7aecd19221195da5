"""What an operator used to Kafka's tools meets with ``strom`` against a real cluster without
``--acls`` (found from outside, as a Kafka operator): ACL calls accepted where nothing enforces
them, null keys and values printed as empty ones, and records the topic allows that
``strom produce`` could not send."""

from __future__ import annotations

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
def bootstrap(one_node_cluster: LocalCluster) -> str:
    with Admin(one_node_cluster.bootstrap) as admin:
        admin.create_topic("op-hk", partitions=1, replication_factor=1)
        admin.create_topic("op-nulls", partitions=1, replication_factor=1)
        admin.create_topic("op-empty", partitions=1, replication_factor=1)
        admin.create_topic(
            "op-big", partitions=1, replication_factor=1, config={"max.message.bytes": 16 << 20}
        )
    return one_node_cluster.bootstrap


def _one_error_line(stderr: bytes) -> str:
    lines = stderr.decode().strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr.decode(), stderr.decode()
    return lines[0]


@pytest.mark.parametrize(
    "argv",
    [
        ["add", "--deny", "User:*", "--operation", "all", "--topic", "op-hk"],
        ["remove", "--principal", "User:*"],
        ["list"],
    ],
    ids=lambda argv: argv[0],
)
def test_acl_calls_fail_on_a_cluster_that_does_not_enforce_them(
    bootstrap: str, argv: list[str]
) -> None:
    """Found from outside: `acls add --deny 'User:*' --operation all --topic hk` printed
    `added: ...` (exit 0) on a cluster without --acls, and producing to hk went on. Kafka's
    tool fails with SecurityDisabledException there; so does strom now."""
    got = strom("acls", *argv, "-b", bootstrap, check=False)
    assert got.returncode == 1, got
    line = _one_error_line(got.stderr)
    assert "SECURITY_DISABLED: ACLs are not enforced on this cluster" in line
    assert "--acls" in line
    assert got.stdout == b""
    # Nothing was stored: producing still works, as it did, and no entry waits in etcd for
    # a later --acls to surprise anyone.
    strom("produce", "op-hk", "-b", bootstrap, stdin=b"still open\n")


def test_acls_apply_fails_too(bootstrap: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    f = tmp_path / "acls.yaml"
    f.write_text("- principal: User:alice\n  allow: [read]\n  topic: op-hk\n")
    got = strom("acls", "apply", str(f), "-b", bootstrap, check=False)
    assert got.returncode == 1
    assert "SECURITY_DISABLED" in _one_error_line(got.stderr)


def test_consume_prints_null_keys_and_values_as_null(bootstrap: str) -> None:
    """Found from outside (/tmp/rev-cli/nulls.py): a tombstone printed as an empty line and a
    record without a key as one with an empty key."""
    with Producer(bootstrap) as p:
        p.send("op-nulls", None, key=b"k-tombstone")
        p.send("op-nulls", b"", key=b"k-empty")
        p.send("op-nulls", b"v-nullkey", key=None)
        p.send("op-nulls", b"v-emptykey", key=b"")
        p.flush()
    common = ["consume", "op-nulls", "-b", bootstrap, "--from-beginning", "--max-messages", "4"]
    assert strom(*common, "--print-key", "--key-separator", "|").stdout == (
        b"k-tombstone|null\nk-empty|\nnull|v-nullkey\n|v-emptykey\n"
    )
    assert strom(*common).stdout == b"null\n\nv-nullkey\nv-emptykey\n"
    assert strom(*common, "--format", "<{key}> <{value}>").stdout == (
        b"<k-tombstone> <null>\n<k-empty> <>\n<null> <v-nullkey>\n<> <v-emptykey>\n"
    )


def test_consume_offset_earliest_and_latest(bootstrap: str) -> None:
    """Kafka's console consumer takes --offset earliest|latest (with --partition)."""
    strom("produce", "op-empty", "-b", bootstrap, stdin=b"a\nb\n")
    common = ["consume", "op-empty", "-b", bootstrap, "--partition", "0"]
    got = strom(*common, "--offset", "earliest", "--max-messages", "2").stdout
    assert got == b"a\nb\n"
    got = strom(*common, "--offset", "latest", "--timeout-ms", "1500").stdout
    assert got == b""


def test_produce_sends_what_the_topic_allows_and_names_the_failing_line(bootstrap: str) -> None:
    """Found from outside: a 5 MiB record to a topic with max.message.bytes 16 MiB failed
    (the producer's fixed 4 MiB max_request_size) and the error named neither the line nor
    how many records had been sent."""
    big = b"x" * (5 << 20)
    lines = b"first\n" + big + b"\nlast\n"
    bad = strom("produce", "op-big", "-b", bootstrap, stdin=lines, check=False)
    assert bad.returncode == 1
    line = _one_error_line(bad.stderr)
    assert line.startswith("strom produce: error: MESSAGE_TOO_LARGE: line 2: "), line
    assert "--producer-property max.request.size=BYTES" in line
    assert line.endswith("the 1 record before it were sent (MessageTooLargeError)"), line
    ok = strom(
        "produce",
        "op-big",
        "-b",
        bootstrap,
        "--producer-property",
        "max.request.size=16777216",
        stdin=lines,
    )
    assert b"produced 3 records" in ok.stderr
    got = strom(
        "consume",
        "op-big",
        "-b",
        bootstrap,
        "--from-beginning",
        "--max-messages",
        "4",
        "--format",
        "{offset}:{value:.5}",
        "--consumer-property",
        "max.partition.fetch.bytes=16777216",
    ).stdout
    # The failed run sent the line before the big one, and nothing after it.
    assert got == b"0:first\n1:first\n2:xxxxx\n3:last\n"
    # A record over the producer's whole buffer is refused at once, naming the property.
    small_buffer = strom(
        "produce",
        "op-big",
        "-b",
        bootstrap,
        "--producer-property",
        "max.request.size=16777216",
        "--producer-property",
        "buffer.memory=1048576",
        stdin=big + b"\n",
        check=False,
    )
    assert small_buffer.returncode == 1
    line = _one_error_line(small_buffer.stderr)
    assert "more than buffer_memory=1048576" in line, line
    assert "--producer-property buffer.memory=BYTES" in line, line


def test_reset_to_an_offset_past_the_end_says_so(bootstrap: str) -> None:
    """Found from outside: `--to-offset 7` on an empty partition silently set 0."""
    got = strom(
        "groups",
        "reset-offsets",
        "op-g",
        "--topic",
        "op-hk",
        "--to-offset",
        "100000",
        "--dry-run",
        "-b",
        bootstrap,
    )
    assert b"New offset (100000) is higher than latest offset (" in got.stderr
    assert b"dry run" in got.stdout


def test_reset_all_topics_of_a_group_by_duration(bootstrap: str) -> None:
    """--all-topics (the partitions the group committed) and --to-duration (Kafka's tool's
    --by-duration, taken too). Its own topic and records (found from outside: it read
    op-nulls' records, written by an earlier test, and failed when run alone)."""
    with Admin(bootstrap) as admin:
        admin.create_topic("op-dur", partitions=1, replication_factor=1)
    strom("produce", "op-dur", "-b", bootstrap, stdin=b"one\ntwo\nthree\n")
    common = ["groups", "reset-offsets", "op-dur", "-b", bootstrap]
    got = strom(*common, "--all-topics", "--to-latest")
    assert b"group op-dur has no committed offsets: nothing to reset" in got.stdout
    strom(*common, "--topic", "op-dur", "--to-latest", "--execute")
    got = strom(*common, "--all-topics", "--to-duration", "PT1H", "--execute")
    assert b"reset 1 offsets of group op-dur" in got.stdout, got.stdout
    rows = [line.split() for line in got.stdout.decode().splitlines()]
    assert ["op-dur", "0", "3", "0"] in rows, rows  # every record is less than an hour old
    # Kafka's tool calls it --by-duration (found from outside: a usage error listing
    # --to-duration); both are taken.
    strom(*common, "--topic", "op-dur", "--to-latest", "--execute")
    again = strom(*common, "--all-topics", "--by-duration", "PT1H", "--execute")
    assert again.stdout == got.stdout


def _rows(stdout: bytes) -> list[list[str]]:
    return [line.split(None, 3) for line in stdout.decode().splitlines()]


def test_delete_offsets_of_a_group_refuses_a_topic_its_members_are_subscribed_to(
    bootstrap: str,
) -> None:
    """Kafka's `kafka-consumer-groups --delete-offsets`: the offsets of the topics given are
    deleted and printed; a topic a member of the group is subscribed to keeps its offsets
    (GROUP_SUBSCRIBED_TO_TOPIC, one line on stderr, exit 1) while the others go."""
    a, b = TopicPartition("op-do-a", 0), TopicPartition("op-do-b", 1)
    with Admin(bootstrap) as admin:
        admin.create_topic("op-do-a", partitions=1, replication_factor=1)
        admin.create_topic("op-do-b", partitions=2, replication_factor=1)
        admin.alter_group_offsets("op-do", {a: 0, TopicPartition("op-do-b", 0): 0, b: 0})
        common = ["groups", "delete-offsets", "op-do", "-b", bootstrap]
        with Consumer(bootstrap, group_id="op-do") as member:
            member.subscribe(["op-do-a"])
            wait_for(
                lambda: member.poll(timeout_ms=100) is not None and member.assignment(),
                timeout=60,
                what="the member's assignment",
            )
            got = strom(*common, "--topic", "op-do-a", "--topic", "op-do-b:1", check=False)
            assert got.returncode == 1, got
            line = _one_error_line(got.stderr)
            assert line == (
                "strom groups delete-offsets: error: group op-do has members subscribed to "
                "topic op-do-a: its offsets are kept (stop the members, or let them "
                "unsubscribe, first) (GroupSubscribedToTopicError)"
            )
            assert _rows(got.stdout) == [
                ["TOPIC", "PARTITION", "OFFSET", "STATUS"],
                ["op-do-a", "0", "0", "refused: subscribed"],
                ["op-do-b", "1", "0", "deleted"],
                ["deleted", "1", "offset", "of group op-do"],
            ]
        assert set(admin.list_group_offsets("op-do")) == {a, TopicPartition("op-do-b", 0)}
        got = strom(*common, "--topic", "op-do-a", "--topic", "op-do-b")
        assert _rows(got.stdout) == [
            ["TOPIC", "PARTITION", "OFFSET", "STATUS"],
            ["op-do-a", "0", "0", "deleted"],
            ["op-do-b", "0", "0", "deleted"],
            ["deleted", "2", "offsets", "of group op-do"],
        ]
        assert admin.list_group_offsets("op-do") == {}
        again = strom(*common, "--topic", "op-do-a").stdout.decode()
        assert "group op-do has no committed offsets of topic op-do-a" in again
    unknown = strom(
        "groups", "delete-offsets", "op-nobody", "--topic", "t", "-b", bootstrap, check=False
    )
    assert unknown.returncode == 1
    assert "GROUP_ID_NOT_FOUND" in _one_error_line(unknown.stderr)


def test_reset_to_current_keeps_the_committed_offsets_and_says_where_there_are_none(
    bootstrap: str,
) -> None:
    """Kafka's --to-current: each partition to its committed offset; one with nothing
    committed gets its latest offset, said on stderr; a dry run unless --execute."""
    p0, p1 = TopicPartition("op-cur", 0), TopicPartition("op-cur", 1)
    with Admin(bootstrap) as admin:
        admin.create_topic("op-cur", partitions=2, replication_factor=1)
        with Producer(bootstrap) as p:
            for _ in range(3):
                p.send("op-cur", b"x", partition=0)
                p.send("op-cur", b"y", partition=1)
            p.flush()
        admin.alter_group_offsets("op-cur-g", {p0: 2})
        common = ["groups", "reset-offsets", "op-cur-g", "--topic", "op-cur", "--to-current"]
        dry = strom(*common, "-b", bootstrap)
        assert _rows(dry.stdout)[:3] == [
            ["TOPIC", "PARTITION", "CURRENT-OFFSET", "NEW-OFFSET"],
            ["op-cur", "0", "2", "2"],
            ["op-cur", "1", "-", "3"],
        ]
        assert b"dry run" in dry.stdout
        assert dry.stderr.decode().splitlines() == [
            "strom groups reset-offsets: op-cur-1: no committed offset; setting its latest "
            "offset (3), as Kafka's tool does"
        ]
        assert set(admin.list_group_offsets("op-cur-g")) == {p0}  # nothing changed
        strom(*common, "--execute", "-b", bootstrap)
        got = admin.list_group_offsets("op-cur-g")
        assert {tp: om.offset for tp, om in got.items() if om} == {p0: 2, p1: 3}
