"""The controller's ACL and client-quota RPCs (mixed into ControllerService).

Bindings live in etcd under ``acls/<id>`` (the id is a hash of the binding, so adding one
twice is a no-op) and quotas under ``quotas/<principal>``; the active controller writes them
with its fenced transaction like every other metadata write, and every service watches them
(:func:`strom.security.follow`), so a change applies everywhere within a second, without a
restart.
"""

from __future__ import annotations

import asyncio
import math
from typing import TYPE_CHECKING, Any

import grpc

from strom.api import controller_pb2
from strom.api import metadata_pb2 as md
from strom.errors import ErrorCode
from strom.security.acl import Acl, matches_filter, validate

if TYPE_CHECKING:
    from strom.controller.service import ControllerService

    _Base = ControllerService
else:
    _Base = object

E = ErrorCode


class AclRpcs(_Base):
    """CreateAcls, DescribeAcls, DeleteAcls, AlterClientQuotas, DescribeClientQuotas."""

    def _current_acls(self) -> dict[str, Acl]:
        assert self.view is not None
        with self.view.lock:
            return {k: Acl.from_proto(v.value) for k, v in self.view.acls.items()}

    async def CreateAcls(
        self, request: controller_pb2.CreateAclsRequest, context: grpc.aio.ServicerContext
    ) -> controller_pb2.CreateAclsResponse:
        response = controller_pb2.CreateAclsResponse()

        async def body(lead: Any) -> None:
            assert self.store is not None
            keys = self.store.keys
            puts: list[tuple[str, md.AclBinding]] = []
            for b in request.acls:
                why = validate(b)
                if why is not None:
                    response.results.add(code=E.INVALID_REQUEST, message=why)
                    continue
                acl = Acl.from_proto(b)
                puts.append((keys.acl(acl.key), acl.to_proto()))
                response.results.add(code=E.NONE)
            if puts:
                await asyncio.to_thread(self._txn, lead, (), puts=puts)
                wanted = {k.removeprefix(keys.acls_prefix) for k, _ in puts}
                await self._await_view(
                    lambda: wanted <= set(self.view.acls),  # type: ignore[union-attr]
                    "the new ACLs",
                )

        return await self._handle("CreateAcls", response, body, write=True)

    async def DescribeAcls(
        self, request: controller_pb2.DescribeAclsRequest, context: grpc.aio.ServicerContext
    ) -> controller_pb2.DescribeAclsResponse:
        response = controller_pb2.DescribeAclsResponse()

        async def body(lead: Any) -> None:
            found = [a for a in self._current_acls().values() if matches_filter(a, request.filter)]
            response.acls.extend(a.to_proto() for a in sorted(found))

        return await self._handle("DescribeAcls", response, body, write=False)

    async def DeleteAcls(
        self, request: controller_pb2.DeleteAclsRequest, context: grpc.aio.ServicerContext
    ) -> controller_pb2.DeleteAclsResponse:
        response = controller_pb2.DeleteAclsResponse()

        async def body(lead: Any) -> None:
            assert self.store is not None
            keys = self.store.keys
            gone = {
                k: a
                for k, a in self._current_acls().items()
                if any(matches_filter(a, f) for f in request.filters)
            }
            if gone:
                await asyncio.to_thread(self._txn, lead, (), deletes=[keys.acl(k) for k in gone])
                await self._await_view(
                    lambda: not set(gone) & set(self.view.acls),  # type: ignore[union-attr]
                    "the ACLs removed",
                )
            response.deleted.extend(a.to_proto() for a in sorted(gone.values()))

        return await self._handle("DeleteAcls", response, body, write=True)

    async def AlterClientQuotas(
        self, request: controller_pb2.AlterClientQuotasRequest, context: grpc.aio.ServicerContext
    ) -> controller_pb2.AlterClientQuotasResponse:
        response = controller_pb2.AlterClientQuotasResponse()
        for q in request.quotas:
            why = _quota_problem(q)
            if why is not None:
                response.error_code = E.INVALID_REQUEST  # type: ignore[assignment]
                response.error_message = why
                return response

        async def body(lead: Any) -> None:
            assert self.store is not None
            keys = self.store.keys
            puts = []
            deletes = []
            for q in request.quotas:
                rates = (
                    q.produce_bytes_per_second,
                    q.fetch_bytes_per_second,
                    q.requests_per_second,
                )
                if any(rates):
                    puts.append((keys.quota(q.principal), q))
                else:
                    deletes.append(keys.quota(q.principal))
            await asyncio.to_thread(self._txn, lead, (), puts=puts, deletes=deletes)

        return await self._handle("AlterClientQuotas", response, body, write=True)

    async def DescribeClientQuotas(
        self,
        request: controller_pb2.DescribeClientQuotasRequest,
        context: grpc.aio.ServicerContext,
    ) -> controller_pb2.DescribeClientQuotasResponse:
        response = controller_pb2.DescribeClientQuotasResponse()

        async def body(lead: Any) -> None:
            assert self.view is not None
            with self.view.lock:
                quotas = sorted((v.value for v in self.view.quotas.values()), key=_principal)
            response.quotas.extend(quotas)

        return await self._handle("DescribeClientQuotas", response, body, write=False)


def _principal(q: md.ClientQuota) -> str:
    return q.principal


def _quota_problem(q: md.ClientQuota) -> str | None:
    if not q.principal.startswith("User:") or len(q.principal) <= len("User:"):
        return f"principal must be 'User:<name>' or 'User:*', got {q.principal!r}"
    for name in ("produce_bytes_per_second", "fetch_bytes_per_second", "requests_per_second"):
        v = getattr(q, name)
        if v < 0 or math.isnan(v) or math.isinf(v):
            return f"{name} must be a finite rate >= 0 (0 = unlimited), got {v}"
    return None


__all__ = ["AclRpcs"]
