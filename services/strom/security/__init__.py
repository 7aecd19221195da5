"""strom's security: TLS and mTLS, authentication (client certificates, bearer tokens),
ACL authorization and client quotas (Kafka's model; see the modules).

Services call :func:`configure` with their parsed flags, the runtime serves with
:func:`server_security`'s credentials and interceptors, and :func:`follow` keeps the ACLs and
quotas current from the service's etcd view.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from strom.security.acl import Acl
from strom.security.config import (
    ChannelSecurity,
    EtcdSecurity,
    ServerSecurity,
    add_arguments,
    configure,
    default_channel,
    etcd,
)
from strom.security.config import server as server_security
from strom.security.interceptor import CURRENT_PRINCIPAL, interceptors
from strom.security.quotas import QUOTAS, QuotaManager

if TYPE_CHECKING:
    from strom.metadata import ClusterView, WatchEvent

__all__ = [
    "CURRENT_PRINCIPAL",
    "QUOTAS",
    "ChannelSecurity",
    "EtcdSecurity",
    "QuotaManager",
    "ServerSecurity",
    "add_arguments",
    "configure",
    "default_channel",
    "etcd",
    "follow",
    "interceptors",
    "server_security",
]


def follow(view: ClusterView, security: ServerSecurity, quotas: QuotaManager = QUOTAS) -> None:
    """Keep ``security``'s ACLs and ``quotas`` equal to what etcd holds: now, and after every
    change under ``acls/`` or ``quotas/`` (the view's watch delivers it, within a second)."""

    def load() -> None:
        with view.lock:
            acls = [Acl.from_proto(v.value) for v in view.acls.values()]
            qs = {v.value.principal: v.value for v in view.quotas.values()}
        security.authorizer.replace(acls)
        quotas.replace(qs)

    def on_events(events: list[WatchEvent]) -> None:
        # Rebuilt from the view's tables on every change: a resync reports what exists, not
        # what was deleted, and the tables are small.
        load()

    view.add_listener(on_events)
    load()
