"""Whose data a storage node's data dir holds: its node id, cluster name and cluster id.

A node deletes the replicas in its data dir that the cluster does not assign to it (strays:
a topic deleted, a partition moved while it was down). Started on an existing data dir with
the wrong ``--node-id`` or ``--cluster``, every replica there looked like a stray and was
deleted within seconds (found from outside). So the data dir records whose it is in
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
identity of the flags (so upgrades need nothing), but the node deletes no stray during that
first start, since nothing could confirm those flags were the right ones; from the next
start on the recorded identity is checked and strays are deleted as usual.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from strom.log.checkpoint import write_atomic
from strom.log.manager import parse_log_dir_name

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

    def encode(self) -> bytes:
        for what, value in (("cluster name", self.cluster), ("cluster id", self.cluster_id)):
            if any(c in value for c in "\r\n"):
                raise IdentityError(f"the {what} {value!r} cannot be recorded (a line break)")
        return (
            "# Which node of which cluster this data dir belongs to; written once by the\n"
            "# storage node, checked at every start. Do not copy it to another node's dir.\n"
            f"version={VERSION}\n"
            f"node.id={self.node_id}\n"
            f"cluster.name={self.cluster}\n"
            f"cluster.id={self.cluster_id}\n"
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
    return Identity(int(node), cluster, props.get("cluster.id", ""))


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
    "restore it, or remove it to have the node take its flags as the dir's identity "
    "(no replica is deleted on that start)"
)


def write_identity(data_dir: Path, identity: Identity, *, fsync: bool = True) -> None:
    """Write ``data_dir``'s identity file whole or not at all (temp file, fsync, rename)."""
    Path(data_dir).mkdir(parents=True, exist_ok=True)
    write_atomic(Path(data_dir) / IDENTITY_FILE, identity.encode(), fsync=fsync)


def has_logs(data_dir: Path) -> bool:
    """Whether ``data_dir`` holds any partition log (a directory named like one)."""
    try:
        entries = list(Path(data_dir).iterdir())
    except FileNotFoundError:
        return False
    return any(
        p.is_dir() and not p.name.endswith(".deleted") and parse_log_dir_name(p.name) is not None
        for p in entries
    )


class DataDirIdentity:
    """A node's check of its data dir against its flags and the cluster in etcd.

    :meth:`check_flags` runs first, reading only (a start refused for another reason, such
    as a node id in use, must leave the dir as it found it); :meth:`settle` runs once the
    cluster view is known, refuses a changed cluster id and writes the file when it is new
    or learns the cluster id; :meth:`may_delete_strays` is what the partition manager asks
    before deleting logs it never hosted.
    """

    def __init__(self, data_dir: Path, node_id: int, cluster: str, *, fsync: bool = True):
        self.data_dir = Path(data_dir)
        self.path = self.data_dir / IDENTITY_FILE
        self.node_id = node_id
        self.cluster = cluster
        self.fsync = fsync
        self.recorded: Identity | None = None
        #: Logs found without an identity file (an older strom's data dir): adopted, and no
        #: stray is deleted in this process life.
        self.adopted = False

    def _flags(self) -> str:
        return f"--node-id {self.node_id} --cluster {self.cluster}"

    def check_flags(self) -> None:
        """IdentityError when the data dir records another node id or cluster name."""
        rec = read_identity(self.data_dir)
        self.recorded = rec
        if rec is None or (rec.node_id, rec.cluster) == (self.node_id, self.cluster):
            return
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

    def settle(self, cluster_id: str) -> None:
        """Refuse a changed cluster id; write the identity file if there is none yet or it
        does not record the cluster id (``cluster_id``: "" while etcd has none). Blocking."""
        self.check_cluster_id(cluster_id)
        rec = self.recorded
        if rec is not None and (rec.cluster_id or not cluster_id):
            return
        if rec is None:
            self.adopted = has_logs(self.data_dir)
        new = Identity(self.node_id, self.cluster, cluster_id)
        write_identity(self.data_dir, new, fsync=self.fsync)
        self.recorded = new
        if self.adopted:
            log.warning(
                "data dir %s has partition logs but no %s (written by an older strom): "
                "recorded it as %s from the flags; logs the cluster does not assign to this "
                "node are kept on this start and deleted from the next one on",
                self.data_dir,
                IDENTITY_FILE,
                new.describe(),
            )
        elif rec is None:
            log.info("data dir %s recorded as %s", self.data_dir, new.describe())
        else:
            log.info("data dir %s: recorded cluster id %s", self.data_dir, cluster_id)

    def may_delete_strays(self, cluster_id: str) -> bool:
        """Whether logs this process never hosted may be deleted: the data dir is confirmed
        to be this node's in the cluster ``cluster_id`` (recorded before this start, not
        adopted from the flags on it)."""
        rec = self.recorded
        return (
            not self.adopted
            and rec is not None
            and bool(cluster_id)
            and rec.cluster_id == cluster_id
            and (rec.node_id, rec.cluster) == (self.node_id, self.cluster)
        )
