"""``strom acls add|list|remove`` and ``strom quotas set|list``: access control and client
quotas from the shell, as Kafka's ``kafka-acls.sh`` / ``kafka-configs.sh --entity-type
users`` do it. The active controller stores them in etcd; every service applies a change
within a second. On a cluster without ``--acls`` the controller refuses the ACL calls
(SECURITY_DISABLED), as Kafka does without an authorizer.

    strom acls add --allow User:alice --operation write --topic orders
    strom acls add --deny User:bob --operation read --topic-prefix secret-
    strom acls apply acls.yaml             # a file of entries (strom.security.acl_file)
    strom acls list [--principal User:alice]
    strom acls remove --principal User:alice --topic orders
    strom quotas set User:alice --produce-bytes-per-second 1048576   # the other rates stay
    strom quotas set User:alice --fetch-bytes-per-second 0           # 0 removes one rate
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from strom.api import controller_pb2
from strom.api import metadata_pb2 as md
from strom.cli.admin import controller_client
from strom.cli.groups import _table
from strom.cli.jsonout import message_dict
from strom.errors import StromError, error_for
from strom.security.acl import CLUSTER, Acl
from strom.security.acl_file import AclFileError, parse_acl_file
from strom.security.principal import canonical_principal

_OPS = {o.removeprefix("ACL_OPERATION_").lower(): v for o, v in md.AclOperation.items() if v}


def _name(text: str) -> str:
    """A resource name or prefix: an empty one is refused, as the controller refuses to store
    it (as no resource at all, `acls remove --topic ''` would remove the principal's entries
    on every resource). A blank one (spaces only) is as empty."""
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty ('*' for any name)")
    return text


def _principal(text: str) -> str:
    """A principal: an empty one is refused. As a filter it meant "any principal", and with
    --allow it would turn the entry into a DENY. So is one whose name is blank (an entry for
    nobody)."""
    _, colon, name = text.partition(":")
    if not text.strip() or (colon and not name.strip()):
        raise argparse.ArgumentTypeError("must not be empty (User:<name>, or User:* for any)")
    # A certificate's subject as the services derive it: 'User:CN=a, O=b' (a space after
    # the comma) would never match the certificate.
    return canonical_principal(text)


def _resource_args(p: argparse.ArgumentParser, required: bool) -> None:
    r = p.add_mutually_exclusive_group(required=required)
    r.add_argument("--topic", type=_name, metavar="NAME", help="a topic ('*' for every topic)")
    r.add_argument(
        "--topic-prefix", type=_name, metavar="PREFIX", help="every topic starting with PREFIX"
    )
    r.add_argument(
        "--group", type=_name, metavar="NAME", help="a consumer group ('*' for every group)"
    )
    r.add_argument(
        "--group-prefix", type=_name, metavar="PREFIX", help="every group starting with PREFIX"
    )
    r.add_argument(
        "--transactional-id", type=_name, metavar="ID", help="a transactional id ('*' for all)"
    )
    r.add_argument("--cluster", action="store_true", help="the cluster itself")


def add_acls_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    acls = sub.add_parser(
        "acls",
        help="add, list and remove access control entries",
        description="Add, list and remove access control entries. The cluster must enforce "
        "them (services started with --acls): elsewhere every action fails with "
        "SECURITY_DISABLED, as Kafka's tool fails without an authorizer.",
    )
    asub = acls.add_subparsers(dest="acls_cmd", metavar="ACTION")
    asub.required = True
    add = asub.add_parser("add", parents=[common], help="allow or deny an operation")
    who = add.add_mutually_exclusive_group(required=True)
    who.add_argument(
        "--allow", type=_principal, metavar="PRINCIPAL", help="e.g. User:alice, User:CN=app, User:*"
    )
    who.add_argument(
        "--deny", type=_principal, metavar="PRINCIPAL", help="a DENY wins over every ALLOW"
    )
    add.add_argument("--operation", required=True, action="append", choices=sorted(_OPS))
    _resource_args(add, required=True)
    ap = asub.add_parser(
        "apply",
        parents=[common],
        help="add every entry of a YAML file (additive, idempotent; see docs/security.md)",
    )
    ap.add_argument("file", help="the YAML file, '-' for stdin")
    ls = asub.add_parser("list", parents=[common], help="entries (all, or matching)")
    ls.add_argument("--principal", type=_principal)
    _resource_args(ls, required=False)
    ls.add_argument("--json", action="store_true")
    rm = asub.add_parser("remove", parents=[common], help="remove the matching entries")
    rm.add_argument("--principal", type=_principal)
    rm.add_argument("--operation", choices=sorted(_OPS))
    _resource_args(rm, required=False)

    quotas = sub.add_parser("quotas", help="set, list and remove client quotas (per principal)")
    qsub = quotas.add_subparsers(dest="quotas_cmd", metavar="ACTION")
    qsub.required = True
    qs = qsub.add_parser(
        "set",
        parents=[common],
        help="set some of a principal's rates (the others stay; 0 removes one)",
    )
    qs.add_argument(
        "principal", type=_principal, help="User:<name>, or User:* for everyone's default"
    )
    for flag in _RATE_FLAGS:
        qs.add_argument(
            f"--{flag.replace('_', '-')}", type=_rate_arg, default=None, help=_RATE_HELP[flag]
        )
    ql = qsub.add_parser("list", parents=[common], help="every quota")
    ql.add_argument("--json", action="store_true")
    qr = qsub.add_parser("remove", parents=[common], help="remove a principal's quota")
    qr.add_argument("principal", type=_principal, help="User:<name>, or User:* (the default)")


def _resource(args: argparse.Namespace) -> tuple[int, str, int] | None:
    """(resource type, name, pattern type) from the resource flags; None when none given.
    A flag counts when it is given (``is not None``), whatever its value: an empty name
    that slipped through must not widen a filter to every resource."""
    for flag, rtype, pattern in (
        ("topic", md.ACL_RESOURCE_TYPE_TOPIC, md.PATTERN_TYPE_LITERAL),
        ("topic_prefix", md.ACL_RESOURCE_TYPE_TOPIC, md.PATTERN_TYPE_PREFIXED),
        ("group", md.ACL_RESOURCE_TYPE_GROUP, md.PATTERN_TYPE_LITERAL),
        ("group_prefix", md.ACL_RESOURCE_TYPE_GROUP, md.PATTERN_TYPE_PREFIXED),
        ("transactional_id", md.ACL_RESOURCE_TYPE_TRANSACTIONAL_ID, md.PATTERN_TYPE_LITERAL),
    ):
        name = getattr(args, flag, None)
        if name is not None:
            if not name:
                raise ValueError(f"--{flag.replace('_', '-')} must not be empty")
            return rtype, name, pattern
    if getattr(args, "cluster", False):
        return md.ACL_RESOURCE_TYPE_CLUSTER, CLUSTER, md.PATTERN_TYPE_LITERAL
    return None


def _filter(args: argparse.Namespace) -> controller_pb2.AclBindingFilter:
    f = controller_pb2.AclBindingFilter(principal=args.principal or "")
    if getattr(args, "operation", None):
        f.operation = _OPS[args.operation]  # type: ignore[assignment]
    res = _resource(args)
    if res is not None:
        f.resource_type, f.resource_name, f.pattern_type = res  # type: ignore[assignment]
    return f


def _read(path: str) -> str:
    """The ACL file's text; ValueError naming the file when it cannot be read (a decoder's
    message alone does not name it)."""
    try:
        return sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"cannot read {path}: not UTF-8 ({exc})") from None


def run_acls(args: argparse.Namespace, out: Any) -> int:
    if args.acls_cmd == "apply":  # parse (and refuse) before connecting
        try:
            bindings = parse_acl_file(_read(args.file))
        except AclFileError as exc:
            raise ValueError(f"{args.file}: {exc}") from None
    with controller_client(args.bootstrap) as client:
        if args.acls_cmd == "apply":
            if not bindings:
                print(f"{args.file}: no entries", file=out)
                return 0
            resp = client.controller_call(
                "CreateAcls", controller_pb2.CreateAclsRequest(acls=bindings)
            )
            for b, r in zip(bindings, resp.results, strict=True):
                if r.code:
                    raise error_for(r.code, r.message)
                print(f"applied: {Acl.from_proto(b)}", file=out)
            return 0
        if args.acls_cmd == "add":
            res = _resource(args)
            assert res is not None
            principal = args.allow if args.allow is not None else args.deny
            req = controller_pb2.CreateAclsRequest()
            for op in args.operation:
                req.acls.add(
                    principal=principal,
                    operation=_OPS[op],  # type: ignore[arg-type]
                    permission=(
                        md.ACL_PERMISSION_ALLOW
                        if args.allow is not None
                        else md.ACL_PERMISSION_DENY
                    ),
                    resource_type=res[0],  # type: ignore[arg-type]
                    resource_name=res[1],
                    pattern_type=res[2],  # type: ignore[arg-type]
                )
            resp = client.controller_call("CreateAcls", req)
            for b, r in zip(req.acls, resp.results, strict=True):
                if r.code:
                    raise error_for(r.code, r.message)
                print(f"added: {Acl.from_proto(b)}", file=out)
            return 0
        if args.acls_cmd == "list":
            resp = client.controller_call(
                "DescribeAcls", controller_pb2.DescribeAclsRequest(filter=_filter(args))
            )
            if args.json:
                print(
                    json.dumps([message_dict(b) for b in resp.acls]),
                    file=out,
                )
                return 0
            rows = [("PRINCIPAL", "PERMISSION", "OPERATION", "RESOURCE", "NAME", "PATTERN")]
            for b in resp.acls:
                a = Acl.from_proto(b)
                rows.append(
                    (
                        a.principal,
                        "ALLOW" if a.allow else "DENY",
                        a.operation.name,
                        a.resource_type.name,
                        a.name,
                        "PREFIXED" if a.prefixed else "LITERAL",
                    )
                )
            _table(rows, out)
            return 0
        f = _filter(args)
        if not (f.principal or f.operation or f.resource_type):
            raise StromError("remove needs a --principal, --operation or resource to match")
        resp = client.controller_call("DeleteAcls", controller_pb2.DeleteAclsRequest(filters=[f]))
        for b in resp.deleted:
            print(f"removed: {Acl.from_proto(b)}", file=out)
        if not resp.deleted:
            print("no matching entries", file=out)
        return 0


def _rate(value: float) -> str:
    """A rate for the table: "-" for no limit, whole numbers without an exponent."""
    if not value:
        return "-"
    return f"{value:.0f}" if float(value).is_integer() else f"{value:.3f}"


#: The rates of a quota: its ``ClientQuota`` fields, and ``strom quotas set``'s flags.
_RATE_FLAGS = ("produce_bytes_per_second", "fetch_bytes_per_second", "requests_per_second")
#: What each rate counts, on each storage node (docs/security.md, Quotas).
_RATE_HELP = {
    "produce_bytes_per_second": "record bytes produced per second, per storage node",
    "fetch_bytes_per_second": "record bytes fetched per second (consumers), per storage node",
    "requests_per_second": "requests per second to each storage node: every Produce and "
    "consumer Fetch, Metadata, FindCoordinator, InitProducerId, ListOffsets, "
    "OffsetForLeaderEpoch, DeleteRecords, DescribeProducers and the record API's "
    "ProduceRecords and Subscribe messages (not calls to controllers or coordinators)",
}


def _rate_arg(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a rate: {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"a rate must be a finite number >= 0, not {text!r}")
    return value


def run_quotas(args: argparse.Namespace, out: Any) -> int:
    if args.quotas_cmd == "set" and all(getattr(args, f) is None for f in _RATE_FLAGS):
        # A set without rates would delete the quota.
        print(
            "strom quotas: error: set needs at least one of --produce-bytes-per-second, "
            "--fetch-bytes-per-second, --requests-per-second (to delete a quota: "
            f"strom quotas remove {args.principal})",
            file=sys.stderr,
        )
        return 2
    with controller_client(args.bootstrap) as client:
        if args.quotas_cmd == "remove":
            # A quota without rates is deleted (AlterClientQuotas).
            client.controller_call(
                "AlterClientQuotas",
                controller_pb2.AlterClientQuotasRequest(
                    quotas=[md.ClientQuota(principal=args.principal)]
                ),
            )
            print(f"quota of {args.principal} removed", file=out)
            return 0
        if args.quotas_cmd == "set":
            # The rates given change, the others stay, as kafka-configs --alter --add-config
            # does. 0 removes one rate; a quota left
            # with none is deleted. (Read, then written: two admins setting the same
            # principal at once may lose one's change.)
            current = client.controller_call(
                "DescribeClientQuotas", controller_pb2.DescribeClientQuotasRequest()
            )
            q = md.ClientQuota(principal=args.principal)
            for old in current.quotas:
                if old.principal == args.principal:
                    q.CopyFrom(old)
            for flag in _RATE_FLAGS:
                if getattr(args, flag) is not None:
                    setattr(q, flag, getattr(args, flag))
            client.controller_call(
                "AlterClientQuotas", controller_pb2.AlterClientQuotasRequest(quotas=[q])
            )
            left = any(getattr(q, f) for f in _RATE_FLAGS)
            print(f"quota of {args.principal} {'set' if left else 'removed'}", file=out)
            return 0
        resp = client.controller_call(
            "DescribeClientQuotas", controller_pb2.DescribeClientQuotasRequest()
        )
        if args.json:
            print(
                json.dumps([message_dict(q) for q in resp.quotas]),
                file=out,
            )
            return 0
        rows = [("PRINCIPAL", "PRODUCE-B/S", "FETCH-B/S", "REQUESTS/S")]
        for q in resp.quotas:
            rows.append(
                (
                    q.principal,
                    _rate(q.produce_bytes_per_second),
                    _rate(q.fetch_bytes_per_second),
                    _rate(q.requests_per_second),
                )
            )
        _table(rows, out)
        return 0
