"""``strom topics configs`` and ``strom cluster configs``: a topic's or a node's configs,
and the dynamic configs every node applies (listed, set or deleted).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from strom.argtypes import UsageError, byte_size
from strom.cli.admin_parser import _kv
from strom.client.admin import Admin
from strom.client.cluster import ClusterClient
from strom.errors import InvalidConfigError


def _configs(admin: Admin, client: ClusterClient, args: argparse.Namespace, out: Any) -> None:
    _print_configs(admin.describe_configs(args.topic), args.json, out)


def _print_configs(entries: dict[str, Any], as_json: bool, out: Any) -> None:
    if as_json:
        print(
            json.dumps(
                [{**e._asdict(), "source": str(e.source)} for e in entries.values()], indent=2
            ),
            file=out,
        )
        return
    for e in entries.values():
        value = "(sensitive)" if e.sensitive else ("-" if e.value is None else e.value)
        flags = " read-only" if e.read_only else ""
        print(f"{e.name}={value}\t({e.source}{flags})", file=out)


def _node_config_changes(args: argparse.Namespace) -> tuple[dict[str, str], list[str]] | None:
    """``cluster configs``' --set/--delete as (set, delete), None when it only lists;
    UsageError for flags that do not fit together or a rate that is not a size, before any
    connection."""
    if not (args.alter or args.set or args.delete):
        return None
    if not (args.set or args.delete):
        raise UsageError("--alter needs --set KEY=VALUE or --delete KEY")
    if args.node is not None:
        raise UsageError(
            "--set/--delete change the dynamic configs of every node: give no node id "
            "(a node's static configs are its startup flags)"
        )
    if args.json:
        raise UsageError("--json goes with a listing, not with --set/--delete")
    settings = _kv(args.set, "--set")
    for key, value in settings.items():
        if key.endswith(".rate"):
            try:
                settings[key] = str(byte_size(value))
            except argparse.ArgumentTypeError as exc:
                raise UsageError(f"--set {key}: {exc}") from None
    both = sorted(set(settings) & set(args.delete or ()))
    if both:
        raise UsageError(f"--set and --delete both name {both[0]}")
    return settings, list(dict.fromkeys(args.delete or ()))


def _cluster_configs(admin: Admin, args: argparse.Namespace, out: Any) -> int:
    """``cluster configs``: a node's static configs, the dynamic ones every node applies
    (the replication throttle rates reassignments set), or a change to those (checked by
    the controller first, so an unknown name or bad value is a usage error, as for the
    flags)."""
    changes = _node_config_changes(args)
    if changes is None:
        if args.node is not None:
            entries = admin.describe_configs(node=args.node)
        else:
            entries = admin.describe_node_configs()
        _print_configs(entries, args.json, out)
        return 0
    settings, delete = changes
    try:
        admin.alter_node_configs(set=settings, delete=delete, validate_only=True)
    except InvalidConfigError as exc:
        raise UsageError(str(exc)) from None
    admin.alter_node_configs(set=settings, delete=delete)
    if settings:  # as stored: the controller normalises (warn -> warning, critical -> error)
        stored = admin.describe_node_configs()
        settings = {k: (stored[k].value if k in stored else v) or v for k, v in settings.items()}
    done = [f"set {k}={v}" for k, v in settings.items()] + [f"deleted {k}" for k in delete]
    print(f"altered the dynamic configs of every node: {', '.join(done)}", file=out)
    return 0
