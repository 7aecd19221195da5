"""Service configuration from flags, ``STROM_*`` environment variables and a YAML file, in
that order of precedence (DESIGN §2)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml


class ConfigFileError(ValueError):
    """The YAML config file is missing, unreadable or names an unknown setting."""


def _dest_names(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {a.dest: a for a in parser._actions if a.dest not in ("help", "config")}


def parse_with_sources(
    parser: argparse.ArgumentParser, argv: Sequence[str] | None, env_prefix: str = "STROM_"
) -> argparse.Namespace:
    """Parse ``argv`` with defaults taken from ``--config FILE`` and then the environment.

    A YAML key or an environment variable names a flag (``metrics-port``, ``metrics_port``
    or ``STROM_METRICS_PORT``); an unknown YAML key is an error that names it.
    """
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config")
    known, _ = pre.parse_known_args(argv)
    actions = _dest_names(parser)
    defaults: dict[str, Any] = {}
    if known.config:
        path = Path(known.config)
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except FileNotFoundError:
            raise ConfigFileError(f"config file {path} does not exist") from None
        except yaml.YAMLError as exc:
            raise ConfigFileError(f"config file {path} is not valid YAML: {exc}") from None
        if not isinstance(data, dict):
            raise ConfigFileError(f"config file {path} must hold a mapping of settings")
        for key, value in data.items():
            dest = str(key).replace("-", "_")
            if dest not in actions:
                raise ConfigFileError(
                    f"config file {path}: unknown setting '{key}' "
                    f"(known: {', '.join(sorted(k.replace('_', '-') for k in actions))})"
                )
            defaults[dest] = value
    for dest, action in actions.items():
        env = os.environ.get(env_prefix + dest.upper())
        if env is not None:
            defaults[dest] = env
        if dest in defaults and action.type is not None and isinstance(defaults[dest], str):
            try:
                defaults[dest] = action.type(defaults[dest])
            except (TypeError, ValueError, argparse.ArgumentTypeError) as exc:
                parser.error(f"invalid value for {dest.replace('_', '-')}: {exc}")
    parser.set_defaults(**defaults)
    # Required flags satisfied by the file or environment are no longer required.
    for dest in defaults:
        if dest in actions:
            actions[dest].required = False
    return parser.parse_args(argv)


def split_host_port(text: str, *, what: str = "address") -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"{what} {text!r} is not HOST:PORT")
    return host or "0.0.0.0", int(port)
