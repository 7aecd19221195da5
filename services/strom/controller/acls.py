"""The controller's ACL and client-quota RPCs (mixed into ControllerService).

Bindings live in etcd under ``acls/<id>`` (the id is a hash of the binding, so adding one
twice is a no-op) and quotas under ``quotas/<principal>``; the active controller writes them
with its fenced transaction like every other metadata write, and every service watches them
(:func:`strom.security.follow`), so a change applies everywhere within a second, without a
restart.

ACLs are enforced by each service's own ``--acls`` flag (every service of a cluster is given
the same security flags: ``strom dev up --tls``, the Helm chart). A controller started without
it answers the ACL RPCs SECURITY_DISABLED, as Kafka answers them without an authorizer: an
entry stored there would be listed as if in force while nothing checks it (found from
outside: ``acls add --deny 'User:*'`` printed ``added`` and producing went on).
"""

from __future__ import annotations

import asyncio
import dataclasses
import math

from strom.api import controller_pb2 as pb
from strom.api import metadata_pb2 as md
from strom.controller.core import ControllerCore, Leadership, rpc
from strom.errors import ErrorCode, SecurityDisabledError
from strom.security import server_security
from strom.security.acl import Acl, matches_filter, validate
from strom.security.principal import canonical_principal

E = ErrorCode

#: The message of SECURITY_DISABLED: the reason, and what turns ACLs on.
NOT_ENFORCED = (
    "ACLs are not enforced on this cluster: start the services (storage nodes, controllers, "
    "coordinators) with --acls and --super-users (see docs/security.md)"
)


def _require_acls() -> None:
    """Refuse an ACL request on a controller that does not enforce ACLs."""
    if not server_security().acls:
        raise SecurityDisabledError(NOT_ENFORCED)


def _canonical_filter(f: pb.AclBindingFilter) -> pb.AclBindingFilter:
    """``f`` with its principal as stored (:func:`canonical_principal`)."""
    if not f.principal or canonical_principal(f.principal) == f.principal:
        return f
    copy = pb.AclBindingFilter()
    copy.CopyFrom(f)
    copy.principal = canonical_principal(f.principal)
    return copy


class AclRpcs(ControllerCore):
    """CreateAcls, DescribeAcls, DeleteAcls, AlterClientQuotas, DescribeClientQuotas."""

    def _current_acls(self) -> dict[str, Acl]:
        with self._live_view.lock:
            return {k: Acl.from_proto(v.value) for k, v in self.view.acls.items()}

    @rpc(write=True)
    async def CreateAcls(
        self, lead: Leadership, request: pb.CreateAclsRequest, response: pb.CreateAclsResponse
    ) -> None:
        _require_acls()
        assert self.store is not None
        keys = self.store.keys
        puts: list[tuple[str, md.AclBinding]] = []
        for b in request.acls:
            why = validate(b)
            if why is not None:
                response.results.add(code=E.INVALID_REQUEST, message=why)
                continue
            # Kept as the services derive certificate principals, whoever the caller is (the
            # CLI canonicalises too): "User:CN=a, O=b" would never match the certificate.
            acl = Acl.from_proto(b)
            acl = dataclasses.replace(acl, principal=canonical_principal(acl.principal))
            puts.append((keys.acl(acl.key), acl.to_proto()))
            response.results.add(code=E.NONE)
        if puts:
            await asyncio.to_thread(self._txn, lead, (), puts=puts)
            wanted = {k.removeprefix(keys.acls_prefix) for k, _ in puts}
            await self._await_view(
                lambda: wanted <= set(self.view.acls),  # type: ignore[union-attr]
                "the new ACLs",
            )

    @rpc(write=False)
    async def DescribeAcls(
        self, lead: Leadership, request: pb.DescribeAclsRequest, response: pb.DescribeAclsResponse
    ) -> None:
        _require_acls()
        f = _canonical_filter(request.filter)
        found = [a for a in self._current_acls().values() if matches_filter(a, f)]
        response.acls.extend(a.to_proto() for a in sorted(found))

    @rpc(write=True)
    async def DeleteAcls(
        self, lead: Leadership, request: pb.DeleteAclsRequest, response: pb.DeleteAclsResponse
    ) -> None:
        _require_acls()
        assert self.store is not None
        keys = self.store.keys
        filters = [_canonical_filter(f) for f in request.filters]
        gone = {
            k: a
            for k, a in self._current_acls().items()
            if any(matches_filter(a, f) for f in filters)
        }
        if gone:
            await asyncio.to_thread(self._txn, lead, (), deletes=[keys.acl(k) for k in gone])
            await self._await_view(
                lambda: not set(gone) & set(self.view.acls),  # type: ignore[union-attr]
                "the ACLs removed",
            )
        response.deleted.extend(a.to_proto() for a in sorted(gone.values()))

    @rpc(write=True)
    async def AlterClientQuotas(
        self,
        lead: Leadership,
        request: pb.AlterClientQuotasRequest,
        response: pb.AlterClientQuotasResponse,
    ) -> None:
        for q in request.quotas:
            why = _quota_problem(q)
            if why is not None:
                response.error_code = E.INVALID_REQUEST  # type: ignore[assignment]
                response.error_message = why
                return response
        assert self.store is not None
        keys = self.store.keys
        puts = []
        deletes = []
        for q in map(_canonical_quota, request.quotas):
            rates = (
                q.produce_bytes_per_second,
                q.fetch_bytes_per_second,
                q.requests_per_second,
            )
            if any(rates):
                puts.append((keys.quota(q.principal), q))
            else:
                deletes.append(keys.quota(q.principal))
            # An entry an older controller stored as typed ("User:CN=a, O=b") is the same
            # principal's: replaced, so that one quota per principal is left.
            deletes.extend(keys.quota(p) for p in self._stored_spellings(q.principal))
        await asyncio.to_thread(self._txn, lead, (), puts=puts, deletes=deletes)

    def _stored_spellings(self, principal: str) -> list[str]:
        """The principals of stored quotas that are ``principal`` written another way."""
        with self._live_view.lock:
            stored = [v.value.principal for v in self.view.quotas.values()]  # type: ignore[union-attr]
        return [p for p in stored if p != principal and canonical_principal(p) == principal]

    @rpc(write=False)
    async def DescribeClientQuotas(
        self,
        lead: Leadership,
        request: pb.DescribeClientQuotasRequest,
        response: pb.DescribeClientQuotasResponse,
    ) -> None:
        with self._live_view.lock:
            stored = [v.value for v in self.view.quotas.values()]
        response.quotas.extend(sorted(map(_canonical_quota, stored), key=_principal))


def _principal(q: md.ClientQuota) -> str:
    return q.principal


def _canonical_quota(q: md.ClientQuota) -> md.ClientQuota:
    """``q`` with its principal as the services derive a certificate's (no space after a
    comma: :func:`canonical_principal`, as the ACL RPCs store theirs), else the quota would
    never apply to the certificate's principal."""
    principal = canonical_principal(q.principal)
    if principal == q.principal:
        return q
    copy = md.ClientQuota()
    copy.CopyFrom(q)
    copy.principal = principal
    return copy


def _quota_problem(q: md.ClientQuota) -> str | None:
    if not q.principal.startswith("User:") or len(q.principal) <= len("User:"):
        return f"principal must be 'User:<name>' or 'User:*', got {q.principal!r}"
    for name in ("produce_bytes_per_second", "fetch_bytes_per_second", "requests_per_second"):
        v = getattr(q, name)
        if v < 0 or math.isnan(v) or math.isinf(v):
            return f"{name} must be a finite rate >= 0 (0 = unlimited), got {v}"
    return None


__all__ = ["AclRpcs"]
