"""Access control (Kafka's AclAuthorizer rules), as a pure engine: bindings in, decisions out.

A request is allowed when the principal is a super user, or when some ALLOW binding matches
and no DENY binding does (a DENY always wins). A binding matches when its principal is the
request's (or ``User:*``), its operation is the one asked (or ALL; READ, WRITE, DELETE and
ALTER also grant DESCRIBE; a DENY only denies its own operation, or ALL), its resource type
is the one asked, and its name matches: a
LITERAL name equals the resource's (or is ``*``), a PREFIXED name starts it. With no matching
binding the answer is no (default deny, once the authorizer is on).

The bindings come from etcd (``acls/<id>``, watched by every service); this module only
decides.
"""

from __future__ import annotations

import enum
import hashlib
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from strom.api import metadata_pb2 as md


class Op(enum.IntEnum):
    """Mirrors ``strom.v1.AclOperation``."""

    ALL = md.ACL_OPERATION_ALL
    READ = md.ACL_OPERATION_READ
    WRITE = md.ACL_OPERATION_WRITE
    CREATE = md.ACL_OPERATION_CREATE
    DELETE = md.ACL_OPERATION_DELETE
    ALTER = md.ACL_OPERATION_ALTER
    DESCRIBE = md.ACL_OPERATION_DESCRIBE
    CLUSTER_ACTION = md.ACL_OPERATION_CLUSTER_ACTION


class Res(enum.IntEnum):
    """Mirrors ``strom.v1.AclResourceType``."""

    TOPIC = md.ACL_RESOURCE_TYPE_TOPIC
    GROUP = md.ACL_RESOURCE_TYPE_GROUP
    CLUSTER = md.ACL_RESOURCE_TYPE_CLUSTER
    TRANSACTIONAL_ID = md.ACL_RESOURCE_TYPE_TRANSACTIONAL_ID


#: The cluster resource's name (any name matches it, as there is only one cluster).
CLUSTER = "kafka-cluster"
#: Operations that grant DESCRIBE too (Kafka's implied operations).
_IMPLIES_DESCRIBE = {Op.READ, Op.WRITE, Op.DELETE, Op.ALTER}
ANY_PRINCIPAL = "User:*"
#: A check's name meaning "some resource of the type" (no real name holds a NUL): the
#: permission on at least one, as Kafka's ``authorizeByResourceType`` (KIP-679).
SOME = "\0some"


@dataclass(frozen=True, order=True)
class Acl:
    """One binding (``strom.v1.AclBinding``)."""

    principal: str
    operation: Op
    allow: bool
    resource_type: Res
    name: str
    prefixed: bool = False

    @classmethod
    def from_proto(cls, b: md.AclBinding) -> Acl:
        return cls(
            b.principal,
            Op(b.operation),
            b.permission == md.ACL_PERMISSION_ALLOW,
            Res(b.resource_type),
            b.resource_name,
            b.pattern_type == md.PATTERN_TYPE_PREFIXED,
        )

    def to_proto(self) -> md.AclBinding:
        return md.AclBinding(
            principal=self.principal,
            operation=int(self.operation),  # type: ignore[arg-type]
            permission=md.ACL_PERMISSION_ALLOW if self.allow else md.ACL_PERMISSION_DENY,
            resource_type=int(self.resource_type),  # type: ignore[arg-type]
            resource_name=self.name,
            pattern_type=md.PATTERN_TYPE_PREFIXED if self.prefixed else md.PATTERN_TYPE_LITERAL,
        )

    @property
    def key(self) -> str:
        """A stable id (the etcd key suffix): the same binding always gets the same one."""
        text = "\0".join(
            (
                self.principal,
                self.operation.name,
                "ALLOW" if self.allow else "DENY",
                self.resource_type.name,
                self.name,
                "PREFIXED" if self.prefixed else "LITERAL",
            )
        )
        return hashlib.sha256(text.encode()).hexdigest()[:32]

    def grants(self, op: Op) -> bool:
        if self.operation is Op.ALL or self.operation is op:
            return True
        return op is Op.DESCRIBE and self.operation in _IMPLIES_DESCRIBE

    def covers(self, resource_type: Res, name: str) -> bool:
        if self.resource_type is not resource_type:
            return False
        if resource_type is Res.CLUSTER:
            return True
        if self.prefixed:
            return name.startswith(self.name)
        return self.name in ("*", name)

    def __str__(self) -> str:
        return (
            f"{'ALLOW' if self.allow else 'DENY'} {self.principal} {self.operation.name} on "
            f"{self.resource_type.name} {'prefix ' if self.prefixed else ''}{self.name!r}"
        )


def validate(b: md.AclBinding) -> str | None:
    """Why a binding cannot be stored (None when it can)."""
    if not b.principal.startswith("User:") or len(b.principal) <= len("User:"):
        return f"principal must be 'User:<name>' or 'User:*', got {b.principal!r}"
    if b.operation not in {int(o) for o in Op}:
        return f"unknown or unset operation {b.operation}"
    if b.permission not in (md.ACL_PERMISSION_ALLOW, md.ACL_PERMISSION_DENY):
        return "permission must be ALLOW or DENY"
    if b.resource_type not in {int(r) for r in Res}:
        return f"unknown or unset resource type {b.resource_type}"
    if b.pattern_type not in (md.PATTERN_TYPE_LITERAL, md.PATTERN_TYPE_PREFIXED):
        return "pattern type must be LITERAL or PREFIXED"
    if not b.resource_name:
        return "resource name must not be empty ('*' for any)"
    if b.pattern_type == md.PATTERN_TYPE_PREFIXED and b.resource_name == "*":
        return "a PREFIXED pattern cannot be '*' (use LITERAL '*' for any name)"
    return None


def matches_filter(acl: Acl, f: Any) -> bool:
    """Whether ``acl`` matches an ``AclBindingFilter`` (unset fields match anything)."""
    return (
        (not f.principal or f.principal == acl.principal)
        and (not f.operation or f.operation == acl.operation)
        and (not f.permission or (f.permission == md.ACL_PERMISSION_ALLOW) == acl.allow)
        and (not f.resource_type or f.resource_type == acl.resource_type)
        and (not f.resource_name or f.resource_name == acl.name)
        and (not f.pattern_type or (f.pattern_type == md.PATTERN_TYPE_PREFIXED) == acl.prefixed)
    )


class Authorizer:
    """Decides requests against the current bindings (thread-safe; replaced as a whole)."""

    def __init__(self, super_users: Iterable[str] = (), acls: Iterable[Acl] = ()) -> None:
        self.super_users = frozenset(super_users)
        self._lock = threading.Lock()
        self._by_principal: dict[str, list[Acl]] = {}
        self.replace(acls)

    def replace(self, acls: Iterable[Acl]) -> None:
        by: dict[str, list[Acl]] = {}
        for a in acls:
            by.setdefault(a.principal, []).append(a)
        with self._lock:
            self._by_principal = by

    def acls(self) -> list[Acl]:
        with self._lock:
            return sorted(a for lst in self._by_principal.values() for a in lst)

    def allowed(self, principal: str, op: Op, resource_type: Res, name: str) -> bool:
        if principal in self.super_users:
            return True
        with self._lock:
            candidates = [
                *self._by_principal.get(principal, ()),
                *self._by_principal.get(ANY_PRINCIPAL, ()),
            ]
        if name == SOME:
            return _some_allowed(candidates, op, resource_type)
        allow = False
        for a in candidates:
            if not a.covers(resource_type, name):
                continue
            if not a.allow:
                # A DENY wins, but only for its own operation (or ALL): as in Kafka, a DENY
                # READ does not take away the DESCRIBE an ALLOW WRITE implies.
                if a.operation in (op, Op.ALL):
                    return False
            elif a.grants(op):
                allow = True
        return allow


def _some_allowed(candidates: list[Acl], op: Op, resource_type: Res) -> bool:
    """Whether ``candidates`` (a principal's bindings and ``User:*``'s) allow ``op`` on at
    least one resource of ``resource_type`` that no DENY takes back: Kafka's
    ``authorizeByResourceType``. An ALLOW is taken back by a DENY of the operation (or ALL)
    covering every name it covers: the literal ``*``, the same literal name, or a prefix of
    its name or prefix."""
    denies = [
        a
        for a in candidates
        if not a.allow and a.resource_type is resource_type and a.operation in (op, Op.ALL)
    ]
    for a in candidates:
        if not a.allow or a.resource_type is not resource_type or not a.grants(op):
            continue
        if not any(_denies_all_of(d, a) for d in denies):
            return True
    return False


def _denies_all_of(deny: Acl, allow: Acl) -> bool:
    if _on_every_name(deny):
        return True
    if deny.prefixed:
        return allow.name.startswith(deny.name) and allow.name != "*"
    return not allow.prefixed and deny.name == allow.name


def _on_every_name(a: Acl) -> bool:
    """A binding on every resource of its type (the cluster, or the literal ``*``)."""
    return a.resource_type is Res.CLUSTER or (not a.prefixed and a.name == "*")
