"""strom's security: TLS and mTLS, authentication (client certificates, bearer tokens),
ACL authorization and client quotas (Kafka's model; see the modules).

Services call :func:`configure` with their parsed flags, the runtime serves with
:func:`server_security`'s credentials and interceptors, and :func:`follow` keeps the ACLs and
quotas current from the service's etcd view.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from strom.metadata import ClusterView, WatchEvent
    from strom.security.channel import ChannelSecurity, default_channel
    from strom.security.config import (
        EtcdSecurity,
        ServerSecurity,
        add_arguments,
        configure,
        etcd,
    )
    from strom.security.config import server as server_security
    from strom.security.interceptor import CURRENT_PRINCIPAL, interceptors
    from strom.security.quotas import QUOTAS, QuotaManager

#: Where each name lives: loaded on first use (PEP 562), so that a client importing
#: :mod:`strom.security.channel` does not load the serving side (cryptography, ACLs, quotas).
_LAZY: dict[str, tuple[str, str]] = {
    name: (f"strom.security.{module}", name)
    for module, names in (
        ("acl", ("Acl",)),
        ("channel", ("ChannelSecurity", "default_channel")),
        ("config", ("EtcdSecurity", "ServerSecurity", "add_arguments", "configure", "etcd")),
        ("interceptor", ("CURRENT_PRINCIPAL", "interceptors")),
        ("quotas", ("QUOTAS", "QuotaManager")),
    )
    for name in names
}
_LAZY["server_security"] = ("strom.security.config", "server")


def __getattr__(name: str) -> Any:
    where = _LAZY.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(where[0]), where[1])
    globals()[name] = value
    return value


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


def follow(view: ClusterView, security: ServerSecurity, quotas: QuotaManager | None = None) -> None:
    """Keep ``security``'s ACLs and ``quotas`` (default: the process's :data:`QUOTAS`) equal
    to what etcd holds: now, and after every change under ``acls/`` or ``quotas/`` (the view's
    watch delivers it, within a second).

    Each is rebuilt only when its own keys changed, or after a resync (which reports what
    exists, not what was deleted). Both were rebuilt on every
    event under the cluster's root, and the rebuild cleared every quota's debt; any
    principal can cause such events (a topic config change, InitProducerId's producer-id
    blocks), so a throttled principal could have its debt forgiven at will."""
    from strom.metadata.view import RESYNC
    from strom.security.acl import Acl
    from strom.security.quotas import QUOTAS

    manager = QUOTAS if quotas is None else quotas
    acls_prefix, quotas_prefix = view.keys.acls_prefix, view.keys.quotas_prefix

    def load(acls: bool = True, quota: bool = True) -> None:
        with view.lock:
            bindings = [Acl.from_proto(v.value) for v in view.acls.values()] if acls else None
            qs = {v.value.principal: v.value for v in view.quotas.values()} if quota else None
        if bindings is not None:
            security.authorizer.replace(bindings)
        if qs is not None:
            manager.replace(qs)

    def on_events(events: list[WatchEvent]) -> None:
        acls = quota = False
        for ev in events:
            if ev is RESYNC:
                acls = quota = True
                break
            acls = acls or ev.key.startswith(acls_prefix)
            quota = quota or ev.key.startswith(quotas_prefix)
        if acls or quota:
            load(acls, quota)

    view.add_listener(on_events)
    load()
