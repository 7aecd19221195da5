"""Driver side of a read: which partitions a query covers and where its ranges start and end.

Partitions come from the nodes' Metadata (``subscribe``, ``subscribePattern``, ``assign``);
offsets from ListOffsets at the partition leaders (earliest, latest = the high watermark, or
the first offset at or after a timestamp), through the same client code the Consumer uses
(:func:`strom.client.offsets.list_offsets`), so leader moves are retried the same way.
Everything a user can get wrong (an unknown topic, a partition the topic lacks, a JSON offset
map that misses partitions, an unreachable cluster) is reported here with a plain message.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from strom.client.cluster import ClusterClient
from strom.client.offsets import EARLIEST as LO_EARLIEST
from strom.client.offsets import LATEST as LO_LATEST
from strom.client.offsets import list_offsets
from strom.client.types import TopicPartition
from strom.errors import BrokerNotAvailableError, StromError, UnknownTopicOrPartitionError
from strom_spark.errors import ClusterUnavailableError, DataLossError, OptionError, StromSparkError
from strom_spark.options import EARLIEST, LATEST, OffsetBound, ReadOptions, Subscription
from strom_spark.planning import OffsetRange

#: The least time offset lookups keep retrying leader moves before giving up.
LOOKUP_TIMEOUT_S = 30.0
#: The most one ListOffsets request may wait. Well below LOOKUP_TIMEOUT_S: a leader that hangs
#: (a stopped process) then costs one try, and there is time left to refresh metadata and ask
#: the partition's new leader once the controller has moved it (as Spark's Kafka source
#: retries fetchOffset.numRetries times with a metadata refresh in between).
CALL_TIMEOUT_S = 5.0


class ClusterView:
    """Metadata and offset lookups for one read's options (driver only; not picklable)."""

    def __init__(self, opts: ReadOptions) -> None:
        self.opts = opts
        self.client = ClusterClient(
            list(opts.bootstrap),
            timeout_s=opts.request_timeout_ms / 1000.0,
            retry_s=opts.metadata_retry_s,
            client_id=opts.client_id,
            security=opts.security.channel(),
        )
        self.leaders = self.client.cache  # strom.client.metadata, as the Consumer uses

    @property
    def _call_timeout_s(self) -> float:
        return min(self.opts.request_timeout_ms / 1000.0, CALL_TIMEOUT_S)

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> ClusterView:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _unreachable(self, exc: Exception) -> StromSparkError:
        return ClusterUnavailableError(
            f"strom: cannot reach the cluster at bootstrap={','.join(self.opts.bootstrap)}: {exc}"
        )

    # -- partitions ---------------------------------------------------------------------------

    def partitions(self, sub: Subscription, *, missing_ok: bool = False) -> list[TopicPartition]:
        """The partitions ``sub`` covers now, sorted. A subscribed topic or assigned partition
        the cluster lacks is an error, or with ``missing_ok`` left out: a running stream
        reports partitions that went away as data loss (their topic was deleted) instead."""
        try:
            if sub.kind == "subscribePattern":
                md = self.client.metadata(timeout_s=self._call_timeout_s)
                pattern = re.compile(sub.pattern or "")
                out = [
                    TopicPartition(t.name, p.partition)
                    for t in md.topics
                    if not t.is_internal and t.error_code == 0 and pattern.fullmatch(t.name)
                    for p in t.partitions
                ]
                return sorted(out)
            if sub.kind == "subscribe":
                out = []
                for topic in sub.topics:
                    found = self._topic_partitions(topic, sub, missing_ok=missing_ok)
                    out.extend(TopicPartition(topic, p) for p in found)
                return sorted(out)
            have: dict[str, set[int]] = {}
            out = []
            for tp in sub.partitions:
                if tp.topic not in have:
                    have[tp.topic] = self._topic_partitions(tp.topic, sub, missing_ok=missing_ok)
                if tp.partition in have[tp.topic]:
                    out.append(tp)
                elif not missing_ok:
                    raise OptionError(
                        f"option assign names {tp.topic}-{tp.partition}, but topic "
                        f"{tp.topic!r} has partitions 0..{max(have[tp.topic], default=-1)}"
                    )
            return sorted(out)
        except BrokerNotAvailableError as exc:
            raise self._unreachable(exc) from None

    def _topic_partitions(self, topic: str, sub: Subscription, *, missing_ok: bool) -> set[int]:
        try:
            md = self.client.topic_metadata(topic)
        except UnknownTopicOrPartitionError:
            if missing_ok:
                return set()
            raise StromSparkError(
                f"strom: unknown topic {topic!r} ({sub.describe()}); create it first, e.g. "
                f"`strom topics create {topic} --partitions 6`"
            ) from None
        return {p.partition for p in md.partitions}

    # -- offsets --------------------------------------------------------------------------------

    def _list(self, query: Mapping[TopicPartition, int]) -> dict[TopicPartition, tuple[int, int]]:
        """ListOffsets: {tp: (offset, timestamp)}; offset -1 = no record matched. A
        read_committed read asks for the last stable offset as "latest" (nothing of a
        transaction still open is planned)."""
        if not query:
            return {}
        try:
            found = list_offsets(
                self.client,
                self.leaders,
                query,
                timeout_s=max(self.opts.metadata_retry_s, LOOKUP_TIMEOUT_S),
                call_timeout_s=self._call_timeout_s,
                backoff_s=0.1,
                client_metadata=(("strom-client-id", self.opts.client_id),),
                read_committed=self.opts.read_committed,
            )
        except BrokerNotAvailableError as exc:
            raise self._unreachable(exc) from None
        except StromError as exc:
            raise StromSparkError(f"strom: looking up offsets failed: {exc}") from None
        return {tp: (r.offset, r.timestamp) for tp, r in found.items()}

    def earliest(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: o for tp, (o, _) in self._list(dict.fromkeys(tps, LO_EARLIEST)).items()}

    def latest(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: o for tp, (o, _) in self._list(dict.fromkeys(tps, LO_LATEST)).items()}

    def ready(self, tps: Iterable[TopicPartition]) -> list[TopicPartition]:
        """Those of ``tps`` whose leader is known and registered now. A partition just added
        to a topic has none for a moment; a stream leaves it out of a trigger instead of
        failing, and picks it up on a later one."""
        tps = list(tps)
        try:
            self.leaders.refresh({tp.topic for tp in tps})
        except BrokerNotAvailableError as exc:
            raise self._unreachable(exc) from None
        out = []
        for tp in tps:
            leader = self.leaders.get(tp)
            if leader is not None and leader.address is not None:
                out.append(tp)
        return out

    def known(self, tps: Iterable[TopicPartition]) -> list[TopicPartition]:
        """Those of ``tps`` the cluster's metadata has now (with a live leader or not); the
        others are gone: their topic was deleted."""
        tps = list(tps)
        try:
            self.leaders.refresh({tp.topic for tp in tps})
        except BrokerNotAvailableError as exc:
            raise self._unreachable(exc) from None
        return [tp for tp in tps if self.leaders.get(tp) is not None]

    def for_times(self, query: Mapping[TopicPartition, int]) -> dict[TopicPartition, int | None]:
        """The first offset whose record timestamp is >= the given one (None: every record is
        older)."""
        return {tp: (o if o >= 0 else None) for tp, (o, _) in self._list(query).items()}

    def resolve(
        self,
        bound: OffsetBound,
        tps: list[TopicPartition],
        *,
        start: bool,
        earliest: Mapping[TopicPartition, int],
        latest: Mapping[TopicPartition, int],
        covered: list[TopicPartition] | None = None,
    ) -> dict[TopicPartition, int]:
        """Concrete offsets for ``bound`` on every partition of ``tps``. A JSON bound may also
        name the other partitions in ``covered`` (those the subscription has but a filter
        leaves out: the same options work with and without the filter)."""
        if bound.kind == "earliest":
            return {tp: earliest[tp] for tp in tps}
        if bound.kind == "latest":
            return {tp: latest[tp] for tp in tps}
        if bound.kind == "offsets":
            given = bound.mapping
            _check_covers(bound.option, given, tps, covered)
            out = {}
            for tp in tps:
                off = given[tp]
                out[tp] = earliest[tp] if off == EARLIEST else latest[tp] if off == LATEST else off
            return out
        if bound.kind == "timestamp":
            query = dict.fromkeys(tps, int(bound.timestamp or 0))
        else:
            given = bound.mapping
            _check_covers(bound.option, given, tps, covered)
            query = {tp: given[tp] for tp in tps}
        found = self.for_times(query)
        out = {}
        for tp in tps:
            off = found.get(tp)
            if off is not None:
                out[tp] = off
            elif not start or self.opts.starting_strategy == "latest":
                out[tp] = latest[tp]  # no record that new: the end of the partition
            else:
                raise StromSparkError(
                    f"strom: no record of {tp.topic}-{tp.partition} has a timestamp at or after "
                    f"{query[tp]} ({bound.option}); set startingOffsetsByTimestampStrategy="
                    "latest to start at the end of such partitions instead"
                )
        return out


def _check_covers(
    option: str,
    given: Mapping[TopicPartition, int],
    tps: list[TopicPartition],
    covered: list[TopicPartition] | None = None,
) -> None:
    missing = [tp for tp in tps if tp not in given]
    allowed = set(tps) | set(covered or ())
    extra = [tp for tp in given if tp not in allowed]
    if missing:
        names = ", ".join(f"{tp.topic}-{tp.partition}" for tp in missing[:10])
        raise OptionError(
            f"option {option} has no entry for {names}; give every partition the query reads "
            "(-2 = earliest, -1 = latest in startingOffsets/endingOffsets)"
        )
    if extra:
        names = ", ".join(f"{tp.topic}-{tp.partition}" for tp in extra[:10])
        raise OptionError(f"option {option} names {names}, which the query does not read")


def check_ranges(
    opts: ReadOptions,
    starts: Mapping[TopicPartition, int],
    ends: Mapping[TopicPartition, int],
    earliest: Mapping[TopicPartition, int],
    latest: Mapping[TopicPartition, int],
) -> list[OffsetRange]:
    """Batch ranges from resolved bounds, with Kafka's checks: a start before the log start is
    data loss (an error, or moved up with failOnDataLoss=false); an end past the high
    watermark or before the start is a bad option."""
    out = []
    for tp in sorted(starts):
        s, e = starts[tp], ends[tp]
        if e > latest[tp]:
            raise OptionError(
                f"option {opts.ending.option} asks for {tp.topic}-{tp.partition} up to offset "
                f"{e}, but it ends at {latest[tp]} ("
                + ("its last stable offset" if opts.read_committed else "its high watermark")
                + ")"
            )
        if s > e:
            raise OptionError(
                f"the read of {tp.topic}-{tp.partition} starts at offset {s}, after its end "
                f"{e} ({opts.starting.option} / {opts.ending.option})"
            )
        if s < earliest[tp]:
            if opts.fail_on_data_loss:
                raise DataLossError(
                    f"strom: data loss in {tp.topic}-{tp.partition}: the read starts at offset "
                    f"{s} but the log starts at {earliest[tp]} (offsets {s} to "
                    f"{earliest[tp] - 1} were deleted). Set failOnDataLoss=false to read what is "
                    "left"
                )
            s = min(earliest[tp], e)  # what is left of the range (nothing if all is gone)
        out.append(OffsetRange(tp, s, e))
    return out
