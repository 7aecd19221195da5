"""Arguments of the console tools and the groups reset that a Kafka operator gives (found from
outside): usage errors that exited 1 or with a traceback, null keys and values printed as
empty ones, client settings the console tools could not take, resets clamped in silence."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any

import pytest

from strom.cli import console
from strom.cli import main as cli_main
from strom.cli.groups import plan_reset
from strom.cli.main import main
from strom.client import consumer as consumer_module
from strom.client.cluster import ClusterClient
from strom.client.consumer import Consumer
from strom.client.producer import Producer
from strom.client.types import TopicPartition
from strom.devcluster.cluster import LocalCluster
from strom.errors import error_name

B = ["--bootstrap", "127.0.0.1:1"]
RUN_AND_DRY = ["--execute", "--dry-run"]


@pytest.fixture
def nothing_connects(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_a: Any, **_k: Any) -> None:
        raise AssertionError("the command went on to connect")

    for cls in (ClusterClient, Producer, Consumer, LocalCluster):
        monkeypatch.setattr(cls, "__init__", refuse)


def _exit(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exit_:  # refused by argparse itself (a flag's type)
        return exit_.code  # type: ignore[return-value]


@pytest.mark.usefixtures("nothing_connects")
@pytest.mark.parametrize(
    ("argv", "prog", "said"),
    [
        (["consume", "", *B], "strom consume", "argument topic: the topic name must not be"),
        (["produce", " ", *B], "strom produce", "argument topic: the topic name must not be"),
        (["consume", "t", "--partition", "0", "--offset", "-2", *B], "strom consume", "--offset"),
        (["consume", "t", "--offset", "nope", *B], "strom consume", "--offset"),
        (["consume", "t", "--group", "", *B], "strom consume", "--group: must not be empty"),
        (["consume", "t", "--partition", "-1", *B], "strom consume", "--partition"),
        (["cluster", "configs", "-1", *B], "strom cluster configs", "argument node"),
        (["consume", "t", "--bootstrap", "foo"], "strom consume", "--bootstrap/-b: bootstrap"),
        (["topics", "list", "-b", "h:1,nope"], "strom topics list", "'nope' is not HOST:PORT"),
        (
            ["produce", "t", "--producer-property", "max.request.sise=1", *B],
            "strom produce",
            "--producer-property max.request.sise: unknown; known: buffer_memory",
        ),
        (
            ["produce", "t", "--producer-property", "acks=0", *B],
            "strom produce",
            "--producer-property acks: use --acks instead",
        ),
        (
            ["produce", "t", "--producer-property", "max.request.size=4MiB", *B],
            "strom produce",
            "--producer-property max.request.size=4MiB: must be a whole number",
        ),
        (
            ["produce", "t", "--producer-property", "novalue", *B],
            "strom produce",
            "--producer-property: a property is KEY=VALUE",
        ),
        (
            ["consume", "t", "--consumer-property", "enable.auto.commit=maybe", *B],
            "strom consume",
            "enable.auto.commit=maybe: must be true or false",
        ),
        (
            ["consume", "t", "--consumer-property", "group.id=g", *B],
            "strom consume",
            "--consumer-property group.id: use --group instead",
        ),
        (
            ["groups", "reset-offsets", "g", "--topic", "t", "--to-latest", *RUN_AND_DRY, *B],
            "strom groups reset-offsets",
            "--dry-run: not allowed with argument --execute",
        ),
    ],
)
def test_bad_arguments_are_one_line_usage_errors(
    argv: list[str], prog: str, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found from outside: `--bootstrap foo`, `consume --offset -2`, `consume --group ""` and
    `cluster configs -1` exited 1 as failures in the cluster; `consume ""` printed a
    traceback (the client's TypeError)."""
    assert _exit(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if ": error:" in line]
    assert errors == [err.strip().splitlines()[-1]], err
    assert errors[0].startswith(f"{prog}: error: ") and said in errors[0], errors[0]


@pytest.mark.usefixtures("nothing_connects")
def test_a_client_keyword_refused_by_the_client_is_named_as_the_property(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A value the Producer refuses (its ValueError names its keyword) is a usage error that
    names the property given."""

    def check(self: Producer, *_a: Any, max_request_size: int = 1, **_k: Any) -> None:
        if max_request_size < 1:
            raise ValueError(f"max_request_size must be >= 1, got {max_request_size}")

    monkeypatch.setattr(Producer, "__init__", check)
    code = _exit(["produce", "t", "--producer-property", "max.request.size=0", *B])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "strom produce: error: --producer-property max_request_size: "
        "max_request_size must be >= 1, got 0"
    )


def test_properties_take_kafka_names_and_keywords() -> None:
    got = console.client_properties(
        [
            ("max.request.size", "16777216"),
            ("request_timeout_ms", "60000"),
            ("max.in.flight.requests.per.connection", "1"),
            ("client.id", "loader"),
        ],
        console.PRODUCER_PROPERTIES,
        "--producer-property",
    )
    assert got == {
        "max_request_size": 16777216,
        "request_timeout_ms": 60000,
        "max_in_flight": 1,
        "client_id": "loader",
    }
    got = console.client_properties(
        [("enable.auto.commit", "False"), ("max.poll.records", "10")],
        console.CONSUMER_PROPERTIES,
        "--consumer-property",
    )
    assert got == {"enable_auto_commit": False, "max_poll_records": 10}


@pytest.mark.parametrize("kind", [Producer, Consumer])
def test_every_property_is_a_keyword_of_its_client(kind: type) -> None:
    import inspect

    known = console.PRODUCER_PROPERTIES if kind is Producer else console.CONSUMER_PROPERTIES
    params = inspect.signature(kind.__init__).parameters
    assert set(known) <= set(params), set(known) - set(params)


@dataclass
class Rec:
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]] = field(default_factory=list)
    topic: str = "t"
    partition: int = 0
    offset: int = 7
    timestamp: int = 0
    timestamp_type: int = 0


def _fmt(**kw: Any) -> Any:
    args = argparse.Namespace(
        format=None, print_key=False, print_timestamp=False, key_separator="\t"
    )
    for k, v in kw.items():
        setattr(args, k, v)
    return console._formatter(args)


def test_a_null_key_or_value_prints_as_null_and_an_empty_one_as_nothing() -> None:
    """Found from outside: `r.key or b""` printed a tombstone as an empty line and a record
    without a key as one with an empty key; Kafka's console consumer prints null."""
    tombstone, empty = Rec(b"k-tombstone", None), Rec(b"k-empty", b"")
    nullkey, emptykey = Rec(None, b"v-nullkey"), Rec(b"", b"v-emptykey")
    plain = _fmt()
    assert [plain(r) for r in (tombstone, empty)] == [b"null\n", b"\n"]
    keyed = _fmt(print_key=True)
    assert [keyed(r) for r in (tombstone, empty, nullkey, emptykey)] == [
        b"k-tombstone\tnull\n",
        b"k-empty\t\n",
        b"null\tv-nullkey\n",
        b"\tv-emptykey\n",
    ]
    template = _fmt(format="{key}={value} [{headers}]")
    assert template(Rec(None, None, [("h", None), ("e", b"")])) == b"null=null [h=null,e=]\n"
    assert template(Rec(b"", b"")) == b"= []\n"


def test_a_deliberate_client_type_error_is_one_line_but_a_bug_keeps_its_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The clients refuse a wrong argument type with TypeError (`topic must be a non-empty
    str`): one line, exit 1. A TypeError Python raises inside strom (a bug) is not hidden."""
    from strom.cli import console as console_module

    def refused(_args: Any, _out: Any) -> int:
        consumer_module._topic_partition(("", 0))
        return 0

    monkeypatch.setattr(console_module, "run_consume", refused)
    assert main(["consume", "t", *B]) == 1
    assert capsys.readouterr().err == (
        "strom consume: error: topic must be a non-empty str, got ''\n"
    )

    def bug(_args: Any, _out: Any) -> int:
        error_name("x")  # type: ignore[arg-type]  # protobuf's own TypeError
        return 0

    monkeypatch.setattr(console_module, "run_consume", bug)
    with pytest.raises(TypeError, match="Enum value"):
        main(["consume", "t", *B])
    assert cli_main._argument_error(TypeError("made here")) is False  # no traceback at all


def test_a_reset_beyond_the_log_says_where_it_lands() -> None:
    """Found from outside: `--to-offset 7` above the end offset silently set the end; Kafka's
    tool says so. A shift of a partition with nothing committed (Kafka refuses it) counts
    from its earliest offset, and says so."""
    a, b = TopicPartition("t", 0), TopicPartition("t", 1)
    notes: list[str] = []
    plan = plan_reset(
        [a, b], committed={}, earliest={a: 0, b: 3}, latest={a: 0, b: 9}, to_offset=7, notes=notes
    )
    assert plan == {a: 0, b: 7}
    assert notes == ["t-0: New offset (7) is higher than latest offset (0); value will be set to 0"]
    notes.clear()
    plan = plan_reset(
        [a, b],
        committed={a: 0},
        earliest={a: 0, b: 3},
        latest={a: 0, b: 9},
        shift_by=-1,
        notes=notes,
    )
    assert plan == {a: 0, b: 3}
    assert notes == [
        "t-0: New offset (-1) is lower than earliest offset (0); value will be set to 0",
        "t-1: no committed offset to shift; shifting from its earliest offset (3)",
        "t-1: New offset (2) is lower than earliest offset (3); value will be set to 3",
    ]


def test_to_duration_takes_kafkas_iso_8601_durations() -> None:
    from strom.argtypes import UsageError
    from strom.cli.groups import duration_ms

    assert duration_ms("PT1H") == 3_600_000
    assert duration_ms("P1DT12H") == 36 * 3_600_000
    assert duration_ms("pt30m") == 1_800_000
    assert duration_ms("PT0.5S") == 500
    assert duration_ms("P2D") == 2 * 86_400_000
    for bad in ("1h", "P", "PT", "", "PT-1H", "P1H"):
        with pytest.raises(UsageError, match="not an ISO 8601 duration PnDTnHnMnS"):
            duration_ms(bad)


@pytest.mark.usefixtures("nothing_connects")
def test_reset_flags_are_checked_before_connecting(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["groups", "reset-offsets", "g", "--all-topics", "--to-duration", "1h", *B]
    assert _exit(argv) == 2
    assert capsys.readouterr().err.startswith(
        "strom groups reset-offsets: error: --to-duration '1h' is not an ISO 8601 duration"
    )
    argv = ["groups", "reset-offsets", "g", "--all-topics", "--by-duration", "1h", *B]
    assert _exit(argv) == 2  # Kafka's name for --to-duration, named as typed
    assert capsys.readouterr().err.startswith(
        "strom groups reset-offsets: error: --by-duration '1h' is not an ISO 8601 duration"
    )
    argv = ["groups", "reset-offsets", "g", "--all-topics", "--by-duration", "PT1H"]
    assert _exit([*argv, "--to-duration", "PT1H", *B]) == 2  # one strategy, as the others
    assert "--to-duration: not allowed with argument --by-duration" in capsys.readouterr().err
    argv = ["groups", "reset-offsets", "g", "--all-topics", "--topic", "t", "--to-latest", *B]
    assert _exit(argv) == 2
    assert "--topic: not allowed with argument --all-topics" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        ["topics", "list"],
        ["transactions", "find-hanging"],
        ["cluster", "describe"],
    ],
)
def test_timeout_bounds_a_command_against_a_cluster_that_does_not_answer(argv: list[str]) -> None:
    """Found from outside: against a down cluster a command retried for 61-124 s before its
    one-line error, and the tools had no --timeout (Kafka's take one)."""
    import subprocess
    import sys

    from strom.devcluster.procs import free_port

    down = f"127.0.0.1:{free_port()}"  # nothing listens there
    done = subprocess.run(
        [sys.executable, "-m", "strom.cli.main", *argv, "-b", down, "--timeout", "1"],
        capture_output=True,
        text=True,
        timeout=50,  # well below the clients' own retrying (a minute): the bound is --timeout
    )
    assert done.returncode == 1, done.stderr
    assert f"no result within --timeout 1 s (is the cluster at {down} up?" in done.stderr


@pytest.mark.parametrize("argv", [["groups", "list"], ["transactions", "list"]])
def test_coordinator_commands_retry_until_the_timeout_like_the_others(argv: list[str]) -> None:
    """Found from outside: the commands that find coordinators with FindCoordinator asked
    the nodes once, so against a cluster that does not answer they failed in a second or
    so with `no strom node answered FindCoordinator`, and `--timeout` never applied. They
    retry as the other commands do, so the bound is `--timeout` and its message."""
    import subprocess
    import sys

    from strom.devcluster.procs import free_port

    down = f"127.0.0.1:{free_port()}"  # nothing listens there
    done = subprocess.run(
        [sys.executable, "-m", "strom.cli.main", *argv, "-b", down, "--timeout", "8"],
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert done.returncode == 1, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith(
        f"strom {argv[0]}: error: no result within --timeout 8 s (is the cluster at {down} "
        "up? a request already sent may still take effect); last seen: "
    ), line
    assert f"{down}: " in line.split("last seen: ")[1], line  # what its dialling met


def test_timeout_must_be_a_positive_number(capsys: pytest.CaptureFixture[str]) -> None:
    assert _exit(["topics", "list", *B, "--timeout", "0"]) == 2
    assert "argument --timeout: must be more than 0" in capsys.readouterr().err
