"""The options of a strom read or write, parsed and checked once, on the driver.

Names and meanings are those of Spark's Kafka source and sink wherever they apply
(``subscribe``, ``startingOffsets``, ``failOnDataLoss``, ``maxOffsetsPerTrigger``,
``kafka.acks``...), so a user's habits carry over; ``bootstrap`` names the strom nodes
(``kafka.bootstrap.servers`` is accepted too). Spark hands options over as a case-insensitive
map of strings; every value is validated here so that a typo fails the query at once with a
message naming the option, not deep inside a task.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from strom.client.cluster import BOOTSTRAP_ENV, parse_bootstrap
from strom.client.types import TopicPartition
from strom.grpc_options import MAX_BATCH_BYTES
from strom.security.channel import ChannelSecurity, client_security
from strom_spark.errors import OptionError

#: ListOffsets sentinels, as in Kafka's JSON offsets: -2 = earliest, -1 = latest.
EARLIEST = -2
LATEST = -1

_BOOTSTRAP_NAMES = ("bootstrap", "kafka.bootstrap.servers", "bootstrap.servers")

#: TLS and token options of reads and writes, named after the client settings (``strom
#: --ssl-cafile``, ``Producer(ssl_cafile=...)``): paths every executor must be able to read.
_SECURITY_NAMES = ("ssl.cafile", "ssl.certfile", "ssl.keyfile", "token.file")

#: Every read option, by its canonical spelling (lookups are case-insensitive).
READ_OPTIONS = (
    *_BOOTSTRAP_NAMES,
    *_SECURITY_NAMES,
    "subscribe",
    "subscribePattern",
    "assign",
    "startingOffsets",
    "endingOffsets",
    "startingTimestamp",
    "endingTimestamp",
    "startingOffsetsByTimestamp",
    "endingOffsetsByTimestamp",
    "startingOffsetsByTimestampStrategy",
    "minPartitions",
    "maxRecordsPerPartition",
    "failOnDataLoss",
    "includeHeaders",
    "maxOffsetsPerTrigger",
    "minOffsetsPerTrigger",
    "maxTriggerDelay",
    "fetchOffset.numRetries",
    "fetchOffset.retryIntervalMs",
    "kafkaConsumer.pollTimeoutMs",
    "kafka.max.partition.fetch.bytes",
    "kafka.fetch.max.wait.ms",
    "kafka.request.timeout.ms",
    "kafka.client.id",
    "kafka.isolation.level",
)

#: Every write option.
WRITE_OPTIONS = (
    *_BOOTSTRAP_NAMES,
    *_SECURITY_NAMES,
    "topic",
    "kafka.acks",
    "kafka.linger.ms",
    "kafka.batch.size",
    "kafka.compression.type",
    "kafka.request.timeout.ms",
    "kafka.delivery.timeout.ms",
    "kafka.max.request.size",
    "kafka.client.id",
    "exactlyOnce",
    "transactionalIdPrefix",
    "kafka.transaction.timeout.ms",
)

#: Options Spark itself may add to a source's or sink's map; never the user's typo.
_SPARK_INTERNAL = frozenset({"path", "checkpointlocation", "queryname"})


#: Default kafka.transaction.timeout.ms of exactly-once writes: the coordinator's default
#: transaction.max.timeout.ms (15 minutes).
TXN_TIMEOUT_MS = 900_000


#: Default ``kafka.batch.size`` of writes (see WriteOptions.batch_size).
WRITE_BATCH_SIZE = 1024 * 1024


@dataclass(frozen=True)
class Security:
    """How the driver and the executors dial the cluster (options ``ssl.cafile``,
    ``ssl.certfile``, ``ssl.keyfile``, ``token.file``): file paths, read where a client is
    made, so a renewed file is used by the next task. A setting not given falls back to the
    environment (``STROM_SSL_CAFILE``, ``STROM_SSL_CERTFILE``, ``STROM_SSL_KEYFILE``,
    ``STROM_TOKEN`` / ``STROM_TOKEN_FILE``), as every strom client does.

    The connector's clients were made without security, so a
    TLS, mTLS or token cluster could only be reached by setting those variables on the
    driver and on every executor, which was documented nowhere."""

    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    token_file: str | None = None

    def _token(self) -> str | None:
        if self.token_file is None:
            return None
        try:
            token = Path(self.token_file).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise OptionError(
                f"option token.file {self.token_file}: cannot read it: {why}"
            ) from None
        if not token:
            raise OptionError(f"option token.file {self.token_file}: it is empty")
        return token

    def client_kwargs(self) -> dict[str, str]:
        """The settings given, as Producer / Admin keyword arguments."""
        out = {
            "ssl_cafile": self.ssl_cafile,
            "ssl_certfile": self.ssl_certfile,
            "ssl_keyfile": self.ssl_keyfile,
            "token": self._token(),
        }
        return {k: v for k, v in out.items() if v is not None}

    def channel(self) -> ChannelSecurity:
        """The settings for a ClusterClient (the environment where an option is not given)."""
        return client_security(**self.client_kwargs())

    def check(self) -> None:
        """Read and check the files now, on the driver (:class:`OptionError` naming the
        option): a missing file, an expired certificate or a key that is not the
        certificate's fails the query at once, not in every task."""
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            raise OptionError(
                "options ssl.certfile and ssl.keyfile go together (a client certificate)"
            )
        self._token()
        try:
            ChannelSecurity.from_files(
                self.ssl_cafile,
                self.ssl_certfile,
                self.ssl_keyfile,
                names=("option ssl.cafile", "option ssl.certfile", "option ssl.keyfile"),
            )
        except ValueError as exc:
            raise OptionError(str(exc)) from None


@dataclass(frozen=True)
class Subscription:
    """Which partitions a read covers: topics by name, topics by pattern, or an explicit list."""

    kind: str  # "subscribe" | "subscribePattern" | "assign"
    topics: tuple[str, ...] = ()
    pattern: str | None = None
    partitions: tuple[TopicPartition, ...] = ()

    def describe(self) -> str:
        if self.kind == "subscribe":
            return f"subscribe={','.join(self.topics)}"
        if self.kind == "subscribePattern":
            return f"subscribePattern={self.pattern}"
        topics: dict[str, list[int]] = {}
        for tp in self.partitions:
            topics.setdefault(tp.topic, []).append(tp.partition)
        return "assign=" + json.dumps(topics)


@dataclass(frozen=True)
class OffsetBound:
    """Where a read starts or ends.

    ``kind`` is ``earliest`` / ``latest`` (every partition), ``offsets`` (``per_partition``
    holds offsets, with -2 / -1 for earliest / latest), ``timestamps`` (``per_partition`` holds
    timestamps in ms) or ``timestamp`` (one timestamp for every partition).
    """

    kind: str
    per_partition: tuple[tuple[TopicPartition, int], ...] = ()
    timestamp: int | None = None
    option: str = ""  # the option it came from, for error messages

    @property
    def mapping(self) -> dict[TopicPartition, int]:
        return dict(self.per_partition)


@dataclass(frozen=True)
class ReadOptions:
    """A parsed read (batch or streaming). Picklable: it travels to the executors."""

    bootstrap: tuple[str, ...]
    subscription: Subscription
    starting: OffsetBound
    ending: OffsetBound
    starting_strategy: str = "error"  # startingOffsetsByTimestampStrategy: error | latest
    min_partitions: int | None = None
    max_records_per_partition: int | None = None
    fail_on_data_loss: bool = True
    include_headers: bool = False
    max_offsets_per_trigger: int | None = None
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_ms: int = 15 * 60 * 1000
    offset_retries: int = 3
    offset_retry_interval_ms: int = 1000
    poll_timeout_ms: int = 120_000
    max_partition_fetch_bytes: int = 4 * 1024 * 1024
    fetch_max_wait_ms: int = 500
    request_timeout_ms: int = 30_000
    client_id: str = "strom-spark"
    #: ``kafka.isolation.level=read_committed``: ranges end at the last stable offset and
    #: records of aborted transactions are left out (as a read_committed consumer reads).
    read_committed: bool = False
    #: TLS and token settings (``ssl.*``, ``token.file``).
    security: Security = Security()

    @property
    def metadata_retry_s(self) -> float:
        """How long driver-side lookups keep retrying an unanswering cluster
        (``fetchOffset.numRetries`` times ``fetchOffset.retryIntervalMs``, at least 1 s)."""
        return max(self.offset_retries * self.offset_retry_interval_ms / 1000.0, 1.0)


@dataclass(frozen=True)
class WriteOptions:
    """A parsed write (batch or streaming)."""

    bootstrap: tuple[str, ...]
    topic: str | None = None
    acks: str = "all"
    linger_ms: float = 5.0
    #: 1 MiB (the Python Producer's default is 256 KiB): a Spark task writes many rows at
    #: once, and fewer, bigger batches cost the writer and the node less per row (measured:
    #: TaskWriter 0.37-0.50 against 0.41-0.61 CPU s per million 100-byte rows).
    batch_size: int = WRITE_BATCH_SIZE
    compression: str = "none"
    request_timeout_ms: int = 30_000
    delivery_timeout_ms: int = 120_000
    max_request_size: int = 1024 * 1024
    client_id: str = "strom-spark-writer"
    #: ``exactlyOnce=true``: every task writes in one transaction (:mod:`strom_spark.txn`).
    exactly_once: bool = False
    #: Transactional ids and bookkeeping groups are ``<prefix>-<run>-<Spark partition id>``
    #: (:class:`strom_spark.txn.Slot`); None =
    #: derived from the streaming query's id (stable across restarts from its checkpoint),
    #: or a fresh id per batch write.
    transactional_id_prefix: str | None = None
    #: A task's transaction stays open until the driver commits the whole write (or
    #: micro-batch), so the default is the coordinator's largest (transaction.max.timeout.ms).
    transaction_timeout_ms: int = TXN_TIMEOUT_MS
    #: TLS and token settings (``ssl.*``, ``token.file``).
    security: Security = Security()


# -- helpers ------------------------------------------------------------------------------


class _Options:
    """Case-insensitive access that remembers which options were used."""

    def __init__(self, options: Mapping[str, str], known: tuple[str, ...], what: str) -> None:
        self._raw = {str(k).lower(): v for k, v in options.items()}
        self._canon = {name.lower(): name for name in known}
        unknown = sorted(k for k in self._raw if k not in self._canon and k not in _SPARK_INTERNAL)
        if unknown:
            shown = ", ".join(repr(k) for k in unknown)
            raise OptionError(
                f"unknown strom {what} option{'s' if len(unknown) > 1 else ''} {shown}; "
                f"the {what} options are: {', '.join(known)}"
            )

    def get(self, name: str) -> str | None:
        value = self._raw.get(name.lower())
        if value is None:
            return None
        return str(value).strip()

    def has(self, name: str) -> bool:
        return self.get(name) not in (None, "")


def _int(opts: _Options, name: str, default: int | None, minimum: int) -> int | None:
    raw = opts.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise OptionError(f"option {name} must be an integer, got {raw!r}") from None
    if value < minimum:
        raise OptionError(f"option {name} must be >= {minimum}, got {value}")
    return value


def _max_request_size(opts: _Options) -> int:
    """``kafka.max.request.size``, refused above the largest batch strom takes (the
    producer would refuse it on every executor, as a traceback per task)."""
    value = _int(opts, "kafka.max.request.size", 1024 * 1024, 1024) or 1024 * 1024
    if value > MAX_BATCH_BYTES:
        raise OptionError(
            f"option kafka.max.request.size must be <= {MAX_BATCH_BYTES} (the largest batch "
            f"a strom Fetch answer can carry), got {value}"
        )
    return value


def _security(opts: _Options) -> Security:
    """The ``ssl.*`` / ``token.file`` options, checked (see :meth:`Security.check`)."""
    sec = Security(
        *(opts.get(name) or None for name in _SECURITY_NAMES)  # type: ignore[arg-type]
    )
    sec.check()
    return sec


def _bool(opts: _Options, name: str, default: bool) -> bool:
    raw = opts.get(name)
    if raw is None or raw == "":
        return default
    low = raw.lower()
    if low in ("true", "false"):
        return low == "true"
    raise OptionError(f"option {name} must be true or false, got {raw!r}")


_DURATION = re.compile(r"^\s*(\d+)\s*(us|ms|s|sec|m|min|h|d)?\s*$", re.IGNORECASE)
_UNIT_MS = {
    None: 1.0,
    "us": 0.001,
    "ms": 1.0,
    "s": 1000.0,
    "sec": 1000.0,
    "m": 60_000.0,
    "min": 60_000.0,
    "h": 3_600_000.0,
    "d": 86_400_000.0,
}


def parse_duration_ms(raw: str, name: str) -> int:
    """Spark's time strings: ``500ms``, ``30s``, ``15m``, ``1h``, ``2d``; a bare number is ms."""
    m = _DURATION.match(raw)
    if not m:
        raise OptionError(
            f"option {name} must be a duration such as 500ms, 30s, 15m or 1h, got {raw!r}"
        )
    unit = m.group(2).lower() if m.group(2) else None
    return int(int(m.group(1)) * _UNIT_MS[unit])


def _bootstrap(opts: _Options) -> tuple[str, ...]:
    given = [(n, opts.get(n)) for n in _BOOTSTRAP_NAMES if opts.has(n)]
    if len({v for _, v in given}) > 1:
        raise OptionError(
            "bootstrap is given twice with different values: "
            + ", ".join(f"{n}={v}" for n, v in given)
        )
    spec = given[0][1] if given else os.environ.get(BOOTSTRAP_ENV, "")
    if not spec:
        raise OptionError(
            'option bootstrap is required: .option("bootstrap", "host:port[,host:port]") '
            f"(the strom storage nodes), or set {BOOTSTRAP_ENV} on the driver"
        )
    try:
        return tuple(parse_bootstrap(spec))
    except ValueError as exc:
        raise OptionError(f"option bootstrap: {exc}") from None


def _json(raw: str, name: str) -> Any:
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise OptionError(f"option {name} is not valid JSON ({exc.msg}): {raw!r}") from None


def _partition_map(raw: str, name: str, what: str) -> dict[TopicPartition, int]:
    """``{"topic": {"0": 23, "1": -2}}`` → {TopicPartition: int}."""
    data = _json(raw, name)
    example = '{"topicA": {"0": 23, "1": -2}}'
    if not isinstance(data, dict) or not data:
        raise OptionError(f"option {name} must be a JSON object like {example}, got {raw!r}")
    out: dict[TopicPartition, int] = {}
    for topic, parts in data.items():
        if not isinstance(topic, str) or not topic:
            raise OptionError(f"option {name}: topic names must be non-empty strings")
        if not isinstance(parts, dict):
            raise OptionError(
                f"option {name}: topic {topic!r} must map partitions to {what}, like {example}"
            )
        for p, value in parts.items():
            try:
                partition = int(p)
            except (TypeError, ValueError):
                raise OptionError(
                    f"option {name}: partition {p!r} of topic {topic!r} is not a number"
                ) from None
            if partition < 0:
                raise OptionError(f"option {name}: partition {partition} of {topic!r} is < 0")
            if isinstance(value, bool) or not isinstance(value, int):
                raise OptionError(
                    f"option {name}: {topic}-{partition} must be an integer {what}, got {value!r}"
                )
            out[TopicPartition(topic, partition)] = value
    return out


def _subscription(opts: _Options) -> Subscription:
    given = [n for n in ("subscribe", "subscribePattern", "assign") if opts.has(n)]
    if len(given) != 1:
        got = f"got {', '.join(given)}" if given else "got none"
        raise OptionError(
            "exactly one of the options subscribe (topics, comma-separated), subscribePattern "
            f'(a regular expression) or assign (JSON like {{"topicA": [0, 1]}}) is required; {got}'
        )
    kind = given[0]
    raw = opts.get(kind) or ""
    if kind == "subscribe":
        topics = tuple(dict.fromkeys(t.strip() for t in raw.split(",") if t.strip()))
        if not topics:
            raise OptionError(f"option subscribe names no topic: {raw!r}")
        return Subscription(kind, topics=topics)
    if kind == "subscribePattern":
        try:
            re.compile(raw)
        except re.error as exc:
            raise OptionError(
                f"option subscribePattern is not a valid regular expression ({exc}): {raw!r}"
            ) from None
        return Subscription(kind, pattern=raw)
    data = _json(raw, "assign")
    if not isinstance(data, dict) or not data:
        raise OptionError(f'option assign must be JSON like {{"topicA": [0, 1]}}, got {raw!r}')
    tps: list[TopicPartition] = []
    for topic, parts in data.items():
        if not isinstance(parts, list) or not all(
            isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in parts
        ):
            raise OptionError(
                f"option assign: topic {topic!r} must map to a list of partition numbers, "
                f"got {parts!r}"
            )
        tps.extend(TopicPartition(topic, p) for p in parts)
    if not tps:
        raise OptionError(f"option assign names no partition: {raw!r}")
    return Subscription(kind, partitions=tuple(dict.fromkeys(tps)))


def _bound(opts: _Options, which: str, streaming: bool) -> OffsetBound:
    """startingX / endingX, with Kafka's precedence: timestamp > by-timestamp > offsets."""
    ts_name = f"{which}Timestamp"
    by_ts_name = f"{which}OffsetsByTimestamp"
    off_name = f"{which}Offsets"
    if opts.has(ts_name):
        ts = _int(opts, ts_name, None, 0)
        return OffsetBound("timestamp", timestamp=ts, option=ts_name)
    if opts.has(by_ts_name):
        mapping = _partition_map(opts.get(by_ts_name) or "", by_ts_name, "timestamp (ms)")
        for tp, ts in mapping.items():
            if ts < 0:
                raise OptionError(
                    f"option {by_ts_name}: timestamp of {tp.topic}-{tp.partition} must be "
                    f">= 0 (ms since the epoch), got {ts}"
                )
        return OffsetBound("timestamps", tuple(mapping.items()), option=by_ts_name)
    default = "latest" if (streaming or which == "ending") else "earliest"
    raw = opts.get(off_name)
    if raw is None or raw == "":
        return OffsetBound(default, option=off_name)
    low = raw.lower()
    if low in ("earliest", "latest"):
        kind = low
        if not streaming and which == "starting" and kind == "latest":
            raise OptionError(
                "option startingOffsets=latest is not valid for a batch read (it would read "
                "nothing); use earliest, JSON offsets or startingTimestamp"
            )
        if not streaming and which == "ending" and kind == "earliest":
            raise OptionError(
                "option endingOffsets=earliest is not valid for a batch read; use latest, "
                "JSON offsets or endingTimestamp"
            )
        return OffsetBound(kind, option=off_name)
    if not raw.startswith("{"):
        raise OptionError(
            f"option {off_name} must be earliest, latest or JSON like "
            f'{{"topicA": {{"0": 23, "1": -2}}}} (-2 = earliest, -1 = latest), got {raw!r}'
        )
    mapping = _partition_map(raw, off_name, "offset")
    for tp, off in mapping.items():
        if off < EARLIEST:
            raise OptionError(
                f"option {off_name}: offset of {tp.topic}-{tp.partition} must be >= 0, "
                f"or -2 (earliest) / -1 (latest), got {off}"
            )
        if not streaming and which == "starting" and off == LATEST:
            raise OptionError(
                f"option startingOffsets: {tp.topic}-{tp.partition} is -1 (latest), which is "
                "not valid for a batch read"
            )
        if not streaming and which == "ending" and off == EARLIEST:
            raise OptionError(
                f"option endingOffsets: {tp.topic}-{tp.partition} is -2 (earliest), which is "
                "not valid for a batch read"
            )
    return OffsetBound("offsets", tuple(mapping.items()), option=off_name)


# -- public parsers -----------------------------------------------------------------------


def parse_read_options(options: Mapping[str, str], *, streaming: bool) -> ReadOptions:
    """Check and parse a read's options; raises :class:`OptionError` naming the first bad one."""
    opts = _Options(options, READ_OPTIONS, "read")
    bootstrap = _bootstrap(opts)
    subscription = _subscription(opts)
    if streaming:
        for name in ("endingOffsets", "endingTimestamp", "endingOffsetsByTimestamp"):
            if opts.has(name):
                raise OptionError(
                    f"option {name} is for batch reads; a streaming query reads on as data "
                    "arrives (use Trigger.AvailableNow to stop at the current end)"
                )
    starting = _bound(opts, "starting", streaming)
    ending = _bound(opts, "ending", streaming)
    strategy = (opts.get("startingOffsetsByTimestampStrategy") or "error").lower()
    if strategy not in ("error", "latest"):
        raise OptionError(
            f"option startingOffsetsByTimestampStrategy must be error or latest, got {strategy!r}"
        )
    max_trigger_delay = 15 * 60 * 1000
    if opts.has("maxTriggerDelay"):
        max_trigger_delay = parse_duration_ms(opts.get("maxTriggerDelay") or "", "maxTriggerDelay")
    max_per_trigger = _int(opts, "maxOffsetsPerTrigger", None, 1)
    min_per_trigger = _int(opts, "minOffsetsPerTrigger", None, 1)
    if (
        max_per_trigger is not None
        and min_per_trigger is not None
        and min_per_trigger > max_per_trigger
    ):
        raise OptionError(
            f"option minOffsetsPerTrigger ({min_per_trigger}) is larger than "
            f"maxOffsetsPerTrigger ({max_per_trigger})"
        )
    return ReadOptions(
        bootstrap=bootstrap,
        subscription=subscription,
        starting=starting,
        ending=ending,
        starting_strategy=strategy,
        min_partitions=_int(opts, "minPartitions", None, 1),
        max_records_per_partition=_int(opts, "maxRecordsPerPartition", None, 1),
        fail_on_data_loss=_bool(opts, "failOnDataLoss", True),
        include_headers=_bool(opts, "includeHeaders", False),
        max_offsets_per_trigger=max_per_trigger,
        min_offsets_per_trigger=min_per_trigger,
        max_trigger_delay_ms=max_trigger_delay,
        offset_retries=_int(opts, "fetchOffset.numRetries", 3, 0) or 0,
        offset_retry_interval_ms=_int(opts, "fetchOffset.retryIntervalMs", 1000, 1) or 1000,
        poll_timeout_ms=_int(opts, "kafkaConsumer.pollTimeoutMs", 120_000, 1) or 120_000,
        max_partition_fetch_bytes=_int(
            opts, "kafka.max.partition.fetch.bytes", 4 * 1024 * 1024, 1024
        )
        or 4 * 1024 * 1024,
        fetch_max_wait_ms=_int(opts, "kafka.fetch.max.wait.ms", 500, 0) or 0,
        request_timeout_ms=_int(opts, "kafka.request.timeout.ms", 30_000, 1) or 30_000,
        client_id=opts.get("kafka.client.id") or "strom-spark",
        read_committed=_isolation(opts),
        security=_security(opts),
    )


_ISOLATION_LEVELS = ("read_uncommitted", "read_committed")


def _isolation(opts: _Options) -> bool:
    raw = (opts.get("kafka.isolation.level") or "read_uncommitted").lower()
    if raw not in _ISOLATION_LEVELS:
        raise OptionError(
            f"option kafka.isolation.level must be read_uncommitted or read_committed, got {raw!r}"
        )
    return raw == "read_committed"


#: A transactional id prefix: what the coordinator keys on, kept to a safe alphabet.
_PREFIX = re.compile(r"^[A-Za-z0-9._-]{1,200}$")


_ACKS = {"all": "all", "-1": "all", "1": "1", "0": "0"}
_CODECS = ("none", "gzip", "snappy", "lz4", "zstd")


def parse_write_options(options: Mapping[str, str]) -> WriteOptions:
    """Check and parse a write's options; raises :class:`OptionError` naming the first bad one."""
    opts = _Options(options, WRITE_OPTIONS, "write")
    bootstrap = _bootstrap(opts)
    topic = opts.get("topic") or None
    acks_raw = (opts.get("kafka.acks") or "all").lower()
    if acks_raw not in _ACKS:
        raise OptionError(f"option kafka.acks must be all, 1 or 0, got {acks_raw!r}")
    compression = (opts.get("kafka.compression.type") or "none").lower()
    if compression not in _CODECS:
        raise OptionError(
            f"option kafka.compression.type must be one of {', '.join(_CODECS)}, "
            f"got {compression!r}"
        )
    linger = _int(opts, "kafka.linger.ms", 5, 0)
    exactly_once = _bool(opts, "exactlyOnce", False)
    prefix = opts.get("transactionalIdPrefix") or None
    if prefix is not None:
        if not exactly_once:
            raise OptionError(
                "option transactionalIdPrefix only applies with exactlyOnce=true (the "
                "transactional writes); set exactlyOnce=true or drop it"
            )
        if not _PREFIX.match(prefix):
            raise OptionError(
                "option transactionalIdPrefix must be 1 to 200 characters of letters, digits, "
                f"'.', '_' or '-', got {prefix!r}"
            )
    if exactly_once and acks_raw not in ("all", "-1"):
        raise OptionError(
            f"option exactlyOnce=true needs kafka.acks=all (transactions), got {acks_raw!r}"
        )
    txn_timeout = _int(opts, "kafka.transaction.timeout.ms", TXN_TIMEOUT_MS, 1000)
    txn_timeout = txn_timeout or TXN_TIMEOUT_MS
    return WriteOptions(
        bootstrap=bootstrap,
        topic=topic,
        acks=_ACKS[acks_raw],
        linger_ms=float(linger if linger is not None else 5),
        batch_size=_int(opts, "kafka.batch.size", WRITE_BATCH_SIZE, 1) or WRITE_BATCH_SIZE,
        compression=compression,
        request_timeout_ms=_int(opts, "kafka.request.timeout.ms", 30_000, 1) or 30_000,
        delivery_timeout_ms=_int(opts, "kafka.delivery.timeout.ms", 120_000, 1) or 120_000,
        max_request_size=_max_request_size(opts),
        client_id=opts.get("kafka.client.id") or "strom-spark-writer",
        exactly_once=exactly_once,
        transactional_id_prefix=prefix,
        transaction_timeout_ms=txn_timeout,
        security=_security(opts),
    )


def offsets_json(offsets: Mapping[TopicPartition, int]) -> dict[str, dict[str, int]]:
    """{TopicPartition: offset} → Kafka's JSON offset form ``{"t": {"0": 5}}`` (sorted)."""
    out: dict[str, dict[str, int]] = {}
    for tp in sorted(offsets):
        out.setdefault(tp.topic, {})[str(tp.partition)] = int(offsets[tp])
    return out


def offsets_from_json(data: Mapping[str, Any]) -> dict[TopicPartition, int]:
    """The inverse of :func:`offsets_json` (Spark hands partition keys back as strings)."""
    out: dict[TopicPartition, int] = {}
    for topic, parts in data.items():
        for p, off in parts.items():
            out[TopicPartition(topic, int(p))] = int(off)
    return out
