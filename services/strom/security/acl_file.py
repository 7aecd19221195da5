"""ACLs as a YAML file: what ``strom acls apply FILE`` and the Helm chart's ``acls.bootstrap``
read, so a cluster's permissions can live in version control next to its deployment.

The file is a list of entries; each names one principal, the operations it is allowed (or
denied) and exactly one resource::

    - principal: User:CN=orders-service
      allow: [write, describe]
      topic: orders
    - principal: User:CN=billing
      allow: [read]
      group-prefix: billing-
    - principal: User:*
      deny: [all]
      topic-prefix: secret-

Resource keys: ``topic``, ``topic-prefix``, ``group``, ``group-prefix``,
``transactional-id`` (a name, ``'*'`` for any) or ``cluster: true``. Applying is additive and
idempotent (a binding has a stable id); an entry removed from the file is not deleted.
"""

from __future__ import annotations

from typing import Any

import yaml

from strom.api import metadata_pb2 as md
from strom.security.acl import CLUSTER, validate
from strom.security.principal import canonical_principal

#: Operation names accepted in ``allow`` / ``deny`` (as ``strom acls add --operation``).
OPERATIONS = {
    o.removeprefix("ACL_OPERATION_").lower().replace("_", "-"): v
    for o, v in md.AclOperation.items()
    if v
}
#: Resource keys → (resource type, pattern type).
RESOURCES = {
    "topic": (md.ACL_RESOURCE_TYPE_TOPIC, md.PATTERN_TYPE_LITERAL),
    "topic-prefix": (md.ACL_RESOURCE_TYPE_TOPIC, md.PATTERN_TYPE_PREFIXED),
    "group": (md.ACL_RESOURCE_TYPE_GROUP, md.PATTERN_TYPE_LITERAL),
    "group-prefix": (md.ACL_RESOURCE_TYPE_GROUP, md.PATTERN_TYPE_PREFIXED),
    "transactional-id": (md.ACL_RESOURCE_TYPE_TRANSACTIONAL_ID, md.PATTERN_TYPE_LITERAL),
    "cluster": (md.ACL_RESOURCE_TYPE_CLUSTER, md.PATTERN_TYPE_LITERAL),
}


class AclFileError(ValueError):
    """The file cannot be applied; the message names the entry and the field."""


def _entry(i: int, e: Any) -> list[md.AclBinding]:
    where = f"entry {i + 1}"
    if not isinstance(e, dict):
        raise AclFileError(f"{where}: expected a mapping (principal, allow/deny, a resource)")
    unknown = set(e) - {"principal", "allow", "deny", *RESOURCES}
    if unknown:
        raise AclFileError(f"{where}: unknown key(s) {', '.join(sorted(map(str, unknown)))}")
    principal = e.get("principal")
    if not isinstance(principal, str):
        raise AclFileError(f"{where}: 'principal' (User:<name> or User:*) is required")
    # A blank name ('User: ') is none: an entry for nobody, as `acls add` refuses it too.
    if not principal.startswith("User:") or not principal.removeprefix("User:").strip():
        raise AclFileError(
            f"{where}: principal must be 'User:<name>' or 'User:*', got {principal!r}"
        )
    # As the services derive it from a certificate (no space after a comma of its subject),
    # so that 'User:CN=a, O=b' matches the certificate it means.
    principal = canonical_principal(principal)
    if ("allow" in e) == ("deny" in e):
        raise AclFileError(f"{where}: give exactly one of 'allow' or 'deny' (a list of operations)")
    permission = md.ACL_PERMISSION_ALLOW if "allow" in e else md.ACL_PERMISSION_DENY
    ops = e.get("allow", e.get("deny"))
    if isinstance(ops, str):
        ops = [ops]
    if not isinstance(ops, list) or not ops:
        raise AclFileError(f"{where}: 'allow'/'deny' must list operations")
    resources = [k for k in RESOURCES if k in e]
    if len(resources) != 1:
        raise AclFileError(f"{where}: give exactly one resource of {', '.join(RESOURCES)}")
    (key,) = resources
    res_type, pattern = RESOURCES[key]
    if key == "cluster":
        if e[key] is not True:
            raise AclFileError(f"{where}: 'cluster' must be true")
        name = CLUSTER
    else:
        name = e[key]
        if not isinstance(name, str) or not name.strip():
            raise AclFileError(f"{where}: '{key}' must be a non-empty name ('*' for any)")
    out = []
    for op in ops:
        value = OPERATIONS.get(str(op).lower().replace("_", "-"))
        if value is None:
            raise AclFileError(
                f"{where}: unknown operation {op!r} (one of {', '.join(sorted(OPERATIONS))})"
            )
        b = md.AclBinding(
            principal=principal,
            operation=value,  # type: ignore[arg-type]
            permission=permission,
            resource_type=res_type,  # type: ignore[arg-type]
            resource_name=name,
            pattern_type=pattern,  # type: ignore[arg-type]
        )
        why = validate(b)
        if why is not None:
            raise AclFileError(f"{where}: {why}")
        out.append(b)
    return out


def parse_acl_file(text: str) -> list[md.AclBinding]:
    """The bindings a file's text describes; :class:`AclFileError` on the first problem (no
    binding is returned from a file with any problem, so nothing is half-applied)."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        # One line (PyYAML's text quotes the lines, over several).
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise AclFileError(f"not YAML{where}: {problem}") from None
    if data is None:
        return []
    if not isinstance(data, list):
        raise AclFileError("expected a list of entries at the top level")
    return [b for i, e in enumerate(data) for b in _entry(i, e)]
