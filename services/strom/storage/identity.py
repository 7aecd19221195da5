"""Whose data a storage node's data dir holds: its node id, cluster name and cluster id.

A node takes the replicas in its data dir that the cluster does not assign to it out of the
way (strays: a topic deleted, a partition moved while it was down). Started on an existing
data dir with the wrong ``--node-id`` or ``--cluster``, every replica there would look like
a stray and be set aside. So the data dir records whose it is in
``meta.properties``, as Kafka does (``node.id``, ``cluster.id``): written once when a node
first starts on it, and compared on every start with the flags (before anything else touches
the dir) and with the cluster id of the etcd ``cluster`` key (before the logs are opened). A
mismatch refuses the start with one line and leaves the data as it is.

The cluster id is the ``ClusterInfo.cluster_id`` the first controller writes; it is recorded
as soon as the node sees it (a node may start before any controller ran). A recorded id that
differs from etcd's means the cluster was re-created under the same name (its etcd prefix
wiped): its topics are others, so the data is not served to it (Kafka refuses a mismatched
cluster.id too).

A data dir with logs but no ``meta.properties`` was written by an older strom: it takes the
identity of the flags (so upgrades need nothing), but nothing vouches for those flags. Found
from outside: such a dir started once with a wrong ``--node-id`` recorded the wrong id as its
own, the right id was then refused (and told to use the wrong one), and the next start with
the wrong id deleted every replica as strays. So an adopted identity is checked against the
cluster (:func:`cluster_agreement`) whenever the cluster is known (at the start, else at the
first full reconcile that sees it):

- the cluster assigns this node id none of the dir's partition logs: refused (one line; no
  file is written), since a node's own dir holds some of its partitions (one whose topics
  were all deleted while it was down is refused too: the operator removes those logs);
- it assigns this node id some of them, and none of the others is a live partition (they
  are of deleted or re-created topics): the identity is confirmed, and the file says so;
- some of the others are live partitions it assigns only to other nodes (a partition moved
  while the node was down, or a wrong ``--node-id`` on a dir whose topics are partly
  replicated to that id too, as with mixed replication factors): the identity stays
  adopted, "unconfirmed", and ``meta.properties`` records that (``adopted=<when>``).

No stray is set aside in a process life that started on an unconfirmed identity; once a
start finds the file confirmed, strays are set aside as usual. A start with other flags on an
unconfirmed dir is refused with advice that says the identity was only adopted, so the
operator is not sent to the wrong id blindly.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from strom.api import metadata_pb2 as md
from strom.log.checkpoint import write_atomic
from strom.log.manager import parse_log_dir_name
from strom.storage.assignment import TopicPartition, desired_assignments

log = logging.getLogger("strom.storage.identity")

IDENTITY_FILE = "meta.properties"
VERSION = 1


class IdentityError(Exception):
    """The data dir is not this node's (or its identity file cannot be read); the message
    is the one line the operator sees."""


@dataclass(frozen=True)
class Identity:
    """What ``meta.properties`` records."""

    node_id: int
    cluster: str
    #: The cluster's ``ClusterInfo.cluster_id``; "" until the node has seen one.
    cluster_id: str = ""
    #: When the node id and cluster name were taken from the flags of a start on a dir an
    #: older strom wrote (UTC, ISO 8601), while the cluster has not confirmed them; "" once
    #: confirmed (or for a dir the node created).
    adopted: str = ""

    def encode(self) -> bytes:
        for what, value in (("cluster name", self.cluster), ("cluster id", self.cluster_id)):
            if any(c in value for c in "\r\n"):
                raise IdentityError(f"the {what} {value!r} cannot be recorded (a line break)")
        adopted = (
            "# Taken from the flags of a start (the dir had no meta.properties), not yet\n"
            "# confirmed by the cluster: no log here is set aside as a stray until it is.\n"
            f"adopted={self.adopted}\n"
            if self.adopted
            else ""
        )
        return (
            "# Which node of which cluster this data dir belongs to; written once by the\n"
            "# storage node, checked at every start. Do not copy it to another node's dir.\n"
            f"version={VERSION}\n"
            f"node.id={self.node_id}\n"
            f"cluster.name={self.cluster}\n"
            f"cluster.id={self.cluster_id}\n"
            f"{adopted}"
        ).encode()

    def describe(self) -> str:
        cid = f" (id {self.cluster_id})" if self.cluster_id else ""
        return f"node {self.node_id} of cluster {self.cluster!r}{cid}"


def parse_identity(text: str) -> Identity:
    """The identity in a ``meta.properties`` text; ValueError says what is wrong."""
    props: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise ValueError(f"line {line!r} is not key=value")
        props[key.strip()] = value.strip()
    version = props.get("version")
    if version != str(VERSION):
        raise ValueError(f"version {version!r} is not {VERSION} (written by another strom?)")
    node = props.get("node.id", "")
    if not node.isdigit():
        raise ValueError(f"node.id {node!r} is not a node id")
    cluster = props.get("cluster.name", "")
    if not cluster:
        raise ValueError("cluster.name is missing")
    return Identity(int(node), cluster, props.get("cluster.id", ""), props.get("adopted", ""))


def read_identity(data_dir: Path) -> Identity | None:
    """The identity ``data_dir`` records; None when it has no identity file (a new data dir,
    or one an older strom wrote). IdentityError when the file is there but unusable;
    OSError when it cannot be read."""
    path = Path(data_dir) / IDENTITY_FILE
    try:
        text = path.read_bytes().decode()
    except FileNotFoundError:
        return None
    except UnicodeDecodeError as exc:
        raise IdentityError(f"{path} is not text ({exc}): {_UNREADABLE}") from None
    try:
        return parse_identity(text)
    except ValueError as exc:
        raise IdentityError(f"{path} is unusable ({exc}): {_UNREADABLE}") from None


_UNREADABLE = (
    "restore it, or remove it to have the node take its flags as the dir's identity if the "
    "cluster's assignment of its logs agrees (no replica is set aside on that start)"
)


def write_identity(data_dir: Path, identity: Identity, *, fsync: bool = True) -> None:
    """Write ``data_dir``'s identity file whole or not at all (temp file, fsync, rename)."""
    Path(data_dir).mkdir(parents=True, exist_ok=True)
    write_atomic(Path(data_dir) / IDENTITY_FILE, identity.encode(), fsync=fsync)


def partition_dirs(data_dir: Path) -> dict[TopicPartition, Path]:
    """The partition logs in ``data_dir`` (directories named like one, not being deleted)."""
    try:
        entries = list(Path(data_dir).iterdir())
    except FileNotFoundError:
        return {}
    out: dict[TopicPartition, Path] = {}
    for p in entries:
        if p.is_dir() and not p.name.endswith(".deleted"):
            tp = parse_log_dir_name(p.name)
            if tp is not None:
                out[tp] = p
    return out


def has_logs(data_dir: Path) -> bool:
    """Whether ``data_dir`` holds any partition log (a directory named like one)."""
    return bool(partition_dirs(data_dir))


@dataclass(frozen=True)
class Agreement:
    """What the cluster says about a data dir's partition logs, for one node id."""

    #: Partition logs in the dir.
    logs: int
    #: Of them, the ones the cluster assigns to the node id (same topic incarnation).
    mine: int
    #: Of the others, the live partitions the cluster assigns only to other nodes, with
    #: those nodes: the logs that are evidence against the node id.
    elsewhere: Mapping[TopicPartition, tuple[int, ...]] = field(default_factory=dict)

    @property
    def refused(self) -> bool:
        """The dir has logs and the cluster assigns none of them to this node id: not its."""
        return self.logs > 0 and self.mine == 0

    @property
    def confirmed(self) -> bool:
        """Nothing in the dir contradicts the node id (see the module docstring)."""
        return self.logs == 0 or (self.mine > 0 and not self.elsewhere)

    def holders(self) -> list[int]:
        """The node ids the cluster assigns the contested logs to."""
        return sorted({n for nodes in self.elsewhere.values() for n in nodes})


def cluster_agreement(
    node_id: int,
    local: Mapping[TopicPartition, str | None],
    topics: Mapping[str, md.TopicMetadata],
    partitions: Mapping[TopicPartition, md.PartitionState],
) -> Agreement:
    """How the cluster's assignment (``topics``, ``partitions``: an initialised cluster's)
    agrees with ``node_id`` owning the logs ``local`` (each with the topic id recorded beside
    it, None when unknown). Pure."""
    desired = desired_assignments(node_id, topics, partitions)
    mine = 0
    elsewhere: dict[TopicPartition, tuple[int, ...]] = {}
    for tp, local_id in local.items():
        want = desired.get(tp)
        if want is not None:
            if not local_id or not want.topic_id or local_id == want.topic_id:
                mine += 1
            continue  # else an earlier topic of that name: no evidence either way
        state, meta = partitions.get(tp), topics.get(tp[0])
        if state is None or meta is None or meta.deleting:
            continue
        live_id = meta.topic_id or state.topic_id
        if state.topic_id and meta.topic_id and state.topic_id != meta.topic_id:
            continue
        if local_id and live_id and local_id != live_id:
            continue
        others = tuple(sorted(n for n in state.replicas if n != node_id))
        if others:
            elsewhere[tp] = others
    return Agreement(len(local), mine, elsewhere)


def _names(tps: Mapping[TopicPartition, object], limit: int = 3) -> str:
    names = [f"{t}-{p}" for t, p in sorted(tps)]
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def _nodes(ids: list[int]) -> str:
    return ("node " if len(ids) == 1 else "nodes ") + ", ".join(map(str, ids))


def _logs(n: int) -> str:
    return f"{n} partition log" + ("" if n == 1 else "s")


def _utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class DataDirIdentity:
    """A node's check of its data dir against its flags and the cluster in etcd.

    :meth:`check_flags` runs first, reading only (a start refused for another reason, such
    as a node id in use, must leave the dir as it found it); :meth:`settle` runs once the
    cluster view is known, refuses a changed cluster id or an adoption the cluster
    contradicts, and writes the file when it is new, learns the cluster id or is confirmed;
    :meth:`may_set_aside_strays` is what the partition manager asks before setting aside logs it
    never hosted.
    """

    def __init__(self, data_dir: Path, node_id: int, cluster: str, *, fsync: bool = True):
        self.data_dir = Path(data_dir)
        self.path = self.data_dir / IDENTITY_FILE
        self.node_id = node_id
        self.cluster = cluster
        self.fsync = fsync
        self.recorded: Identity | None = None
        #: This process started on a dir whose identity was adopted from the flags (no
        #: file, or one recording an unconfirmed adoption): no stray is set aside in this
        #: process life, even once the cluster confirms it.
        self.adopted = False
        self._warned_unconfirmed = False

    @property
    def confirmed(self) -> bool:
        """Whether the recorded identity stands on its own (not an unconfirmed adoption)."""
        return self.recorded is not None and not self.recorded.adopted

    def _flags(self) -> str:
        return f"--node-id {self.node_id} --cluster {self.cluster}"

    def check_flags(self) -> None:
        """IdentityError when the data dir records another node id or cluster name."""
        rec = read_identity(self.data_dir)
        self.recorded = rec
        self.adopted = rec is not None and bool(rec.adopted)
        if rec is None or (rec.node_id, rec.cluster) == (self.node_id, self.cluster):
            return
        if rec.adopted:
            # The recorded id is only what an earlier start's flags said: it may be the wrong
            # one, so do not send the operator to it as if it were known.
            raise IdentityError(
                f"data dir {self.data_dir} is recorded as {rec.describe()} in {self.path}, "
                f"but that was adopted from the flags of a start on {rec.adopted} (the dir "
                "had no meta.properties) and the cluster has not confirmed it; this node "
                f"was started with {self._flags()}; nothing was changed: if these flags are "
                f"the right ones, remove {self.path} and start again (nothing is set aside "
                f"while the identity is unconfirmed), else start it with --node-id "
                f"{rec.node_id} --cluster {rec.cluster}"
            )
        raise IdentityError(
            f"data dir {self.data_dir} belongs to {rec.describe()} according to {self.path}, "
            f"but this node was started with {self._flags()}; nothing was changed: start it "
            f"with --node-id {rec.node_id} --cluster {rec.cluster} to serve that data, or "
            "give it an empty --data-dir to join as a new node"
        )

    def check_cluster_id(self, cluster_id: str) -> bool:
        """Whether the recorded cluster id is ``cluster_id`` (False: none recorded yet, or
        ``cluster_id`` is unknown); IdentityError when it is another cluster's."""
        rec = self.recorded
        if rec is None or not rec.cluster_id or not cluster_id:
            return False
        if rec.cluster_id == cluster_id:
            return True
        raise IdentityError(
            f"data dir {self.data_dir} belongs to {rec.describe()} according to {self.path}, "
            f"but cluster {self.cluster!r} in etcd now has id {cluster_id} (it was created "
            "again under the same name, so these replicas are not its data); nothing was "
            "changed: give the node an empty --data-dir, or move this one aside to keep it"
        )

    def _refusal(self, agreement: Agreement) -> str:
        rec = self.recorded
        if rec is None:
            origin = f"no {IDENTITY_FILE} (written by an older strom)"
            fix = "start it"
        else:
            origin = (
                f"{self.path} records {rec.describe()} as adopted from the flags on "
                f"{rec.adopted}, unconfirmed"
            )
            fix = f"remove {self.path} and start it"
        holders = agreement.holders()
        where = (
            f" (it assigns {_names(agreement.elsewhere)} to {_nodes(holders)})"
            if holders
            else " (none of them is a live partition in it)"
        )
        return (
            f"data dir {self.data_dir} holds {_logs(agreement.logs)} and {origin}, "
            f"but cluster {self.cluster!r} assigns none of them to node {self.node_id}"
            f"{where}, so it is not this node's data; nothing was changed: {fix} with the "
            "--node-id and --cluster of the node that wrote it, or give this node an empty "
            "--data-dir to join as a new node"
        )

    def settle(self, cluster_id: str, agreement: Agreement | None = None) -> None:
        """Refuse a changed cluster id, or an unconfirmed identity the cluster contradicts
        (``agreement``: :func:`cluster_agreement` for the dir's logs, given whenever the
        cluster is initialised and :attr:`confirmed` is False); write the identity file if
        there is none yet, it does not record the cluster id (``cluster_id``: "" while etcd
        has none) or ``agreement`` confirms an adopted one. Blocking."""
        self.check_cluster_id(cluster_id)
        rec = self.recorded
        if agreement is not None and not self.confirmed and agreement.refused:
            raise IdentityError(self._refusal(agreement))
        confirms = agreement is not None and agreement.confirmed
        if rec is None:
            self.adopted = has_logs(self.data_dir)
            adopted = "" if confirms or not self.adopted else _utc_now()
            new = Identity(self.node_id, self.cluster, cluster_id, adopted)
        elif rec.adopted and confirms:
            new = replace(rec, cluster_id=rec.cluster_id or cluster_id, adopted="")
        elif not rec.cluster_id and cluster_id:
            new = replace(rec, cluster_id=cluster_id)
        else:
            if rec.adopted:
                self._warn_unconfirmed(rec, agreement)
            return
        write_identity(self.data_dir, new, fsync=self.fsync)
        self.recorded = new
        if new.adopted:
            self._warn_unconfirmed(new, agreement)
        elif self.adopted and agreement is not None:  # an agreement confirmed the adoption
            what = (
                f" has partition logs but no {IDENTITY_FILE} (written by an older strom): "
                f"recorded it as {new.describe()} from the flags"
                if rec is None
                else f": identity {new.describe()}, adopted from the flags on {rec.adopted}"
            )
            log.warning(
                "data dir %s%s, confirmed by the cluster (it assigns this node %d of its %s "
                "and no other node the rest); logs it does not assign to this "
                "node are kept on this start and set aside from the next one on",
                self.data_dir,
                what,
                agreement.mine,
                _logs(agreement.logs),
            )
        elif rec is None:
            log.info("data dir %s recorded as %s", self.data_dir, new.describe())
        else:
            log.info("data dir %s: recorded cluster id %s", self.data_dir, cluster_id)

    def _warn_unconfirmed(self, rec: Identity, agreement: Agreement | None) -> None:
        """Say once per process life why the adopted identity is not confirmed yet."""
        if self._warned_unconfirmed:
            return
        self._warned_unconfirmed = True
        if agreement is None:
            why = "the cluster is not initialised yet"
        else:
            why = (
                f"the cluster assigns this node {agreement.mine} of its "
                f"{_logs(agreement.logs)}, but {_names(agreement.elsewhere)} only to "
                f"{_nodes(agreement.holders())} (moved while this node was down, or the "
                f"wrong --node-id: if {rec.node_id} is right, move those logs aside to "
                f"confirm it, else remove {self.path} and start with the right flags)"
            )
        log.warning(
            "data dir %s has partition logs and its identity, %s, was adopted from the flags "
            "on %s (it had no %s) and is not confirmed: %s; no log is set aside as a stray "
            "until it is",
            self.data_dir,
            rec.describe(),
            rec.adopted,
            IDENTITY_FILE,
            why,
        )

    def may_set_aside_strays(self, cluster_id: str) -> bool:
        """Whether logs this process never hosted may be set aside: the data dir is confirmed
        to be this node's in the cluster ``cluster_id`` (recorded and confirmed before this
        start, not adopted from the flags)."""
        rec = self.recorded
        return (
            not self.adopted
            and rec is not None
            and not rec.adopted
            and bool(cluster_id)
            and rec.cluster_id == cluster_id
            and (rec.node_id, rec.cluster) == (self.node_id, self.cluster)
        )
