"""Topic-level log configuration with Kafka's dotted names (DESIGN §1, §5).

One table describes every key strom applies: its type, default and rule. The controller
validates topic configs with :func:`validate_configs` and storage nodes build
:class:`LogConfig` from the same table, so a config accepted at topic creation always means
the same thing on every node.

Every topic config name Apache Kafka 4 defines is known here: the ones that mean something
for strom are in :data:`CONFIG_KEYS` (types and ranges as Kafka's ``LogConfig`` has them,
with the few deviations noted on the key), and the others are in :data:`NOT_APPLICABLE` with
the reason they do not apply, so a refusal says *why* instead of calling a well-known Kafka
name "unknown". ``docs/topic-configs.md`` is the user-facing table.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from strom.grpc_options import FETCH_ANSWER_OVERHEAD_BYTES, MAX_BATCH_BYTES, MAX_MESSAGE_BYTES
from strom.log.errors import ConfigError

#: An integer config value: an optional sign and ASCII digits.
_INTEGER = re.compile(r"[+-]?[0-9]+")

DAY_MS = 24 * 3600 * 1000
#: Kafka's LONG and INT config types (Java's signed 64- and 32-bit integers).
LONG_MAX = (1 << 63) - 1
INT_MAX = (1 << 31) - 1


@dataclass(frozen=True)
class ConfigKey:
    """Definition of one topic config key.

    ``kind`` is the Python type of the parsed value (``int``, ``float``, ``bool``, ``str``);
    ``max_value`` bounds integers to Kafka's INT or LONG range so that a value accepted here is
    also one Kafka tools and clients can hold. ``normalise`` rewrites a parsed value into the
    one form it is stored and shown in, so that equal settings compare equal.
    """

    name: str
    kind: type
    default: Any
    doc: str
    check: Callable[[Any], str | None] = lambda v: None
    choices: tuple[str, ...] = ()
    max_value: int = LONG_MAX
    normalise: Callable[[Any], Any] | None = None


def _at_least(n: int | float) -> Callable[[Any], str | None]:
    return lambda v: None if v >= n else f"must be >= {n}"


def _between(lo: int | float, hi: int | float) -> Callable[[Any], str | None]:
    return lambda v: None if lo <= v <= hi else f"must be in [{lo}, {hi}]"


def _max_message_bytes(v: int) -> str | None:
    """max.message.bytes is bounded above by what one Fetch answer can carry.

    It took any INT, and nodes acknowledged batches that no Fetch
    answer (256 MiB gRPC messages) could hold, or that readers refused: every reader of the
    partition then failed on it for good. Kafka's own bound is its fetch.max.bytes."""
    if 64 <= v <= MAX_BATCH_BYTES:
        return None
    return (
        f"must be in [64, {MAX_BATCH_BYTES}]: {MAX_BATCH_BYTES} bytes is the largest batch a "
        f"Fetch answer can carry ({MAX_MESSAGE_BYTES} bytes, the gRPC message limit, less "
        f"{FETCH_ANSWER_OVERHEAD_BYTES} for the answer's other fields)"
    )


def clamp_stored(name: str, raw: Any) -> Any:
    """A stored override as a node applies it: a ``max.message.bytes`` above the bound (set
    before the bound existed) is applied as the bound, not dropped for the 16 MiB default,
    which would suddenly refuse what the topic's producers send; every other value as is."""
    text = str(raw).strip()
    if name == "max.message.bytes" and _INTEGER.fullmatch(text) and int(text) > MAX_BATCH_BYTES:
        return str(MAX_BATCH_BYTES)
    return raw


def _list_items(v: str) -> str:
    """A LIST value in one form: items trimmed, blanks and repeats dropped, the first
    occurrence's order kept ("compact, compact,delete" -> "compact,delete").

    ``cleanup.policy=compact,compact`` was accepted and stored as
    written, so describe showed the repeat and two equal settings differed as strings.
    Kafka's APPEND keeps the items' order too, hence first-seen order rather than sorting."""
    return ",".join(dict.fromkeys(p.strip() for p in v.split(",") if p.strip()))


def _cleanup_policy(v: str) -> str | None:
    # Kafka parses a LIST: comma-separated, blanks trimmed; each item 'delete' or 'compact'.
    # Kafka 4 also takes an empty list (no cleanup at all); strom refuses it, because it is
    # mostly the accident of subtracting the last policy: retention.ms=-1 keeps everything.
    parts = [p.strip() for p in v.split(",") if p.strip()]
    if not parts or any(p not in ("delete", "compact") for p in parts):
        return "must be 'delete', 'compact' or 'delete,compact'"
    return None


def throttled_replicas_problem(value: str) -> str | None:
    """What is wrong with a ``*.replication.throttled.replicas`` value, or None. Kafka's
    form: empty (none), ``*`` (every replica) or ``partition:node`` items, comma-separated,
    both non-negative integers."""
    text = value.strip()
    if text in ("", "*"):
        return None
    for item in text.split(","):
        p, sep, n = item.strip().partition(":")
        if not sep or not _is_id(p) or not _is_id(n):
            return (
                f"{item.strip()!r} is not partition:node (non-negative integers); the value "
                "must be '*' or a list like 0:1,0:2,1:3"
            )
    return None


def normalise_throttled_replicas(value: str) -> str:
    """One spelling of a list (items trimmed, leading zeros gone, repeats dropped, first
    order kept), so equal settings compare equal."""
    text = value.strip()
    if text in ("", "*") or throttled_replicas_problem(text):
        return text
    items = (item.strip().split(":") for item in text.split(","))
    return ",".join(dict.fromkeys(f"{int(p.strip())}:{int(n.strip())}" for p, n in items))


def _is_id(text: str) -> bool:
    t = text.strip()
    return t.isascii() and t.isdigit()


CONFIG_KEYS: dict[str, ConfigKey] = {
    k.name: k
    for k in [
        ConfigKey(
            "cleanup.policy",
            str,
            "delete",
            "delete old segments, compact by key, or both",
            _cleanup_policy,
            normalise=_list_items,
        ),
        ConfigKey(
            "retention.ms",
            int,
            7 * DAY_MS,
            "delete segments whose newest record is older than this (-1: never)",
            _at_least(-1),
        ),
        ConfigKey(
            "retention.bytes",
            int,
            -1,
            "delete oldest segments while the log is larger than this (-1: no limit)",
            _at_least(-1),
        ),
        # Kafka 4 requires segment.bytes >= 1 MiB; strom keeps 1 KiB so that small segments
        # (tests, demos, tiny topics) stay possible.
        ConfigKey(
            "segment.bytes",
            int,
            1 << 30,
            "roll a new segment at this size",
            lambda v: None if 1024 <= v <= INT_MAX else "must be in [1024, 2^31-1]",
            max_value=INT_MAX,
        ),
        ConfigKey(
            "segment.ms",
            int,
            7 * DAY_MS,
            "roll a new segment after this age, in record time (the newest timestamp appended "
            "minus the segment's first one), as Kafka's",
            _at_least(1),
        ),
        ConfigKey(
            "segment.jitter.ms",
            int,
            0,
            "each segment rolls up to this much (random, below segment.ms) before its "
            "segment.ms, so that many partitions created together do not all roll at once",
            _at_least(0),
        ),
        ConfigKey(
            "segment.index.bytes",
            int,
            10 * 1024 * 1024,
            "largest offset or time index of a segment (8 or 12 bytes an entry); a segment "
            "whose index is full rolls",
            _at_least(4),
            max_value=INT_MAX,
        ),
        ConfigKey(
            "index.interval.bytes",
            int,
            4096,
            "bytes of log between offset-index entries",
            _at_least(0),
            max_value=INT_MAX,
        ),
        ConfigKey(
            "delete.retention.ms",
            int,
            DAY_MS,
            "how long tombstones stay readable on compacted topics",
            _at_least(0),
        ),
        ConfigKey(
            "min.compaction.lag.ms",
            int,
            0,
            "records younger than this are never compacted",
            _at_least(0),
        ),
        ConfigKey(
            "max.compaction.lag.ms",
            int,
            LONG_MAX,
            "a compacted log whose oldest uncleaned record is older than this is cleaned "
            "whatever its dirty ratio (and its active segment rolls by then)",
            _at_least(1),
        ),
        ConfigKey(
            "min.cleanable.dirty.ratio",
            float,
            0.5,
            "clean a compacted log once its not-yet-cleaned bytes are more than this share "
            "of the cleanable log",
            _between(0, 1),
        ),
        ConfigKey(
            "file.delete.delay.ms",
            int,
            60_000,
            "deleted segment files are renamed to .deleted and unlinked this much later",
            _at_least(0),
        ),
        ConfigKey(
            "preallocate",
            bool,
            False,
            "reserve segment.bytes of disk for each new segment (fallocate, size unchanged); "
            "the unused part is given back when the segment rolls",
        ),
        ConfigKey(
            "flush.messages",
            int,
            -1,
            "fsync after this many records (-1: leave it to the OS and replication)",
            _at_least(-1),
        ),
        ConfigKey(
            "flush.ms", int, -1, "fsync at least this often (-1: never forced)", _at_least(-1)
        ),
        ConfigKey(
            "max.message.bytes",
            int,
            16 * 1024 * 1024,
            "largest batch accepted on produce (MESSAGE_TOO_LARGE above it)",
            _max_message_bytes,
            max_value=INT_MAX,
        ),
        ConfigKey(
            "message.timestamp.type",
            str,
            "CreateTime",
            "CreateTime keeps the producer's time, LogAppendTime stamps the broker's",
            choices=("CreateTime", "LogAppendTime"),
        ),
        ConfigKey(
            "message.timestamp.before.max.ms",
            int,
            LONG_MAX,
            "refuse (INVALID_TIMESTAMP) a CreateTime batch holding any record whose timestamp "
            "is more than this before the broker's time",
            _at_least(0),
        ),
        ConfigKey(
            "message.timestamp.after.max.ms",
            int,
            3_600_000,
            "refuse (INVALID_TIMESTAMP) a CreateTime batch whose newest timestamp is more than "
            "this after the broker's time",
            _at_least(0),
        ),
        ConfigKey(
            "min.insync.replicas",
            int,
            1,
            "replicas that must have a batch before acks=all succeeds",
            _at_least(1),
            max_value=INT_MAX,
        ),
        ConfigKey(
            "unclean.leader.election.enable",
            bool,
            False,
            "allow an out-of-sync replica to lead (may lose data)",
        ),
        # strom's own (a broker setting in Kafka): idempotent producer state is per log here.
        ConfigKey(
            "producer.id.expiration.ms",
            int,
            DAY_MS,
            "forget an idempotent producer's sequence state after it has been idle this long",
            _at_least(1),
        ),
        # Kafka's KIP-73 replication throttles (strom.storage.replication_quota): which
        # replicas the nodes' leader.replication.throttled.rate / follower.* rates apply to.
        ConfigKey(
            "leader.replication.throttled.replicas",
            str,
            "",
            "replicas (partition:node, or *) whose leader throttles what it sends them while "
            "they are not in the ISR, to leader.replication.throttled.rate",
            throttled_replicas_problem,
            normalise=normalise_throttled_replicas,
        ),
        ConfigKey(
            "follower.replication.throttled.replicas",
            str,
            "",
            "replicas (partition:node, or *) that throttle their own fetching while not in the "
            "ISR, to follower.replication.throttled.rate",
            throttled_replicas_problem,
            normalise=normalise_throttled_replicas,
        ),
        ConfigKey(
            "compression.type",
            str,
            "producer",
            "accepted for compatibility; strom stores batches as the producer compressed them",
            choices=("producer", "none", "gzip", "snappy", "lz4", "zstd", "uncompressed"),
        ),
    ]
}

_TIERED = (
    "strom has no tiered (remote) storage: every replica keeps its whole log on local disk, "
    "so retention.ms and retention.bytes are the only retention limits"
)
_LEVEL = (
    "strom never recompresses batches on the broker (they are stored as the producer "
    "compressed them), so a broker-side level has nothing to apply to; set the level in the "
    "producer"
)

#: Topic config names Kafka 4 defines that do not apply to strom, with the reason given to
#: the user when one is set.
NOT_APPLICABLE: dict[str, str] = {
    "remote.storage.enable": _TIERED,
    "local.retention.ms": _TIERED,
    "local.retention.bytes": _TIERED,
    "remote.log.copy.disable": _TIERED,
    "remote.log.delete.on.disable": _TIERED,
    "remote.copy.lag.ms": _TIERED,
    "remote.copy.lag.bytes": _TIERED,
    "compression.gzip.level": _LEVEL,
    "compression.lz4.level": _LEVEL,
    "compression.zstd.level": _LEVEL,
    "max.decompressed.message.bytes": (
        "strom's brokers never decompress batches on produce (only headers and CRCs are "
        "checked), so there is no decompressed size to bound"
    ),
    "message.format.version": (
        "removed in Kafka 4.0; strom has a single record-batch format (magic 1), so there is "
        "no older format to write"
    ),
    "message.timestamp.difference.max.ms": (
        "removed in Kafka 4.0; use message.timestamp.before.max.ms and "
        "message.timestamp.after.max.ms"
    ),
    "message.downconversion.enable": (
        "a no-op since Kafka 4.0; strom has a single record-batch format and never converts "
        "batches for older consumers"
    ),
    "errors.deadletterqueue.group.enable": (
        "strom has no share groups, whose dead-letter queue this enables"
    ),
}


def check_name(name: str) -> ConfigKey:
    """The key definition of ``name``; :class:`ConfigError` naming it when strom does not
    apply it (saying why) or when it is not a topic config at all."""
    key = CONFIG_KEYS.get(name)
    if key is not None:
        return key
    reason = NOT_APPLICABLE.get(name)
    if reason is not None:
        raise ConfigError(f"config '{name}' is not supported by strom: {reason}")
    raise ConfigError(f"unknown config '{name}' (known: {', '.join(sorted(CONFIG_KEYS))})")


def parse_value(name: str, raw: Any) -> Any:
    """Parse and check one config value; raise :class:`ConfigError` naming the key."""
    key = check_name(name)
    value: Any
    try:
        if key.kind is bool:
            if isinstance(raw, bool):
                value = raw
            elif str(raw).strip().lower() in ("true", "false"):
                value = str(raw).strip().lower() == "true"
            else:
                raise ValueError
        elif key.kind is int:
            # Python's int() also takes digit-group underscores
            # ('1_000'), which Kafka refuses, and non-ASCII (Arabic-Indic, ...) digits:
            # only plain ASCII integers, which every tool reads the same way.
            if isinstance(raw, bool) or not _INTEGER.fullmatch(str(raw).strip()):
                raise ValueError
            value = int(str(raw).strip())
        elif key.kind is float:
            text = str(raw).strip()
            # The same for float(): no digit-group underscores, ASCII only.
            if isinstance(raw, bool) or "_" in text or not text.isascii():
                raise ValueError
            value = float(text)
            if not math.isfinite(value):
                raise ValueError
        else:
            value = str(raw).strip()
    except ValueError:
        expected = {
            float: "a number",
            int: "int (ASCII digits 0-9 with an optional sign)",
            bool: "bool",
        }.get(key.kind, key.kind.__name__)
        raise ConfigError(
            f"config '{name}' has invalid value {raw!r}: expected {expected}"
        ) from None
    if key.normalise is not None:
        value = key.normalise(value)
    if key.choices and value not in key.choices:
        raise ConfigError(
            f"config '{name}' has invalid value {raw!r}: must be one of {', '.join(key.choices)}"
        )
    problem = key.check(value)
    if problem:
        raise ConfigError(f"config '{name}' has invalid value {raw!r}: {problem}")
    if key.kind is int and not -key.max_value - 1 <= value <= key.max_value:
        raise ConfigError(
            f"config '{name}' has invalid value {raw!r}: must be between {-key.max_value - 1} "
            f"and {key.max_value} (Kafka's {'INT' if key.max_value == INT_MAX else 'LONG'})"
        )
    return value


def format_value(value: Any) -> str:
    """A parsed value as stored and shown (booleans lowercase, as Kafka prints them)."""
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def validate_configs(configs: Mapping[str, Any]) -> dict[str, str]:
    """Validate a topic's config overrides; return them normalised as strings (as stored).

    Besides each value's own rule, the combination must hold together the way Kafka's
    ``LogConfig.validateValues`` requires: min.compaction.lag.ms <= max.compaction.lag.ms
    (with defaults for the one not given).
    """
    parsed = {name: parse_value(name, raw) for name, raw in configs.items()}
    min_lag = parsed.get("min.compaction.lag.ms", CONFIG_KEYS["min.compaction.lag.ms"].default)
    max_lag = parsed.get("max.compaction.lag.ms", CONFIG_KEYS["max.compaction.lag.ms"].default)
    if min_lag > max_lag:
        raise ConfigError(
            f"config 'min.compaction.lag.ms' ({min_lag}) is larger than "
            f"'max.compaction.lag.ms' ({max_lag}): a record cannot have to wait longer than "
            "it may wait"
        )
    return {name: format_value(v) for name, v in parsed.items()}


@dataclass(frozen=True)
class LogConfig:
    """The effective settings of one partition log (defaults overlaid with topic overrides)."""

    segment_bytes: int = CONFIG_KEYS["segment.bytes"].default
    segment_ms: int = CONFIG_KEYS["segment.ms"].default
    segment_jitter_ms: int = CONFIG_KEYS["segment.jitter.ms"].default
    segment_index_bytes: int = CONFIG_KEYS["segment.index.bytes"].default
    retention_ms: int = CONFIG_KEYS["retention.ms"].default
    retention_bytes: int = CONFIG_KEYS["retention.bytes"].default
    cleanup_policy: str = CONFIG_KEYS["cleanup.policy"].default
    delete_retention_ms: int = CONFIG_KEYS["delete.retention.ms"].default
    min_compaction_lag_ms: int = CONFIG_KEYS["min.compaction.lag.ms"].default
    max_compaction_lag_ms: int = CONFIG_KEYS["max.compaction.lag.ms"].default
    min_cleanable_dirty_ratio: float = CONFIG_KEYS["min.cleanable.dirty.ratio"].default
    file_delete_delay_ms: int = CONFIG_KEYS["file.delete.delay.ms"].default
    preallocate: bool = CONFIG_KEYS["preallocate"].default
    index_interval_bytes: int = CONFIG_KEYS["index.interval.bytes"].default
    flush_messages: int = CONFIG_KEYS["flush.messages"].default
    flush_ms: int = CONFIG_KEYS["flush.ms"].default
    max_message_bytes: int = CONFIG_KEYS["max.message.bytes"].default
    message_timestamp_type: str = CONFIG_KEYS["message.timestamp.type"].default
    message_timestamp_before_max_ms: int = CONFIG_KEYS["message.timestamp.before.max.ms"].default
    message_timestamp_after_max_ms: int = CONFIG_KEYS["message.timestamp.after.max.ms"].default
    min_insync_replicas: int = CONFIG_KEYS["min.insync.replicas"].default
    unclean_leader_election_enable: bool = CONFIG_KEYS["unclean.leader.election.enable"].default
    compression_type: str = CONFIG_KEYS["compression.type"].default
    producer_id_expiration_ms: int = CONFIG_KEYS["producer.id.expiration.ms"].default
    leader_replication_throttled_replicas: str = ""
    follower_replication_throttled_replicas: str = ""

    @classmethod
    def from_dict(cls, configs: Mapping[str, Any] | None = None) -> LogConfig:
        """Build from dotted-name overrides (``{"retention.ms": "1000"}``)."""
        kwargs = {
            name.replace(".", "_"): parse_value(name, raw) for name, raw in (configs or {}).items()
        }
        return cls(**kwargs)

    @property
    def compact(self) -> bool:
        return "compact" in self.cleanup_policy

    @property
    def delete(self) -> bool:
        return "delete" in self.cleanup_policy

    @property
    def log_append_time(self) -> bool:
        return self.message_timestamp_type == "LogAppendTime"

    @cached_property
    def checks_timestamps(self) -> bool:
        """Whether produced batches' timestamps are checked against the broker's clock
        (CreateTime with a before/after limit). Derived values are cached: the append path
        reads them for every request."""
        return not self.log_append_time and (
            self.message_timestamp_before_max_ms < LONG_MAX
            or self.message_timestamp_after_max_ms < LONG_MAX
        )

    @cached_property
    def max_segment_ms(self) -> int:
        """How old the active segment may get: segment.ms, or max.compaction.lag.ms when that
        is shorter on a compacted log (the cleaner never touches the active segment, so it
        must roll in time for the lag to be honoured), as Kafka's ``maxSegmentMs``."""
        if self.compact:
            return min(self.segment_ms, self.max_compaction_lag_ms)
        return self.segment_ms

    @cached_property
    def max_index_entries(self) -> int:
        """Offset-index entries (8 bytes each) a segment may hold before it rolls."""
        return max(self.segment_index_bytes // 8, 1)

    @cached_property
    def max_time_index_entries(self) -> int:
        """Time-index entries (12 bytes each) a segment may hold before it rolls."""
        return max(self.segment_index_bytes // 12, 1)
