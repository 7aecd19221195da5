"""Service configuration from flags, ``STROM_*`` environment variables and a YAML file, in
that order of precedence (DESIGN §2)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from strom.argtypes import host_problem


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
        data = _load(path)
        if not isinstance(data, dict):
            raise ConfigFileError(f"config file {path} must hold a mapping of settings")
        for key, value in data.items():
            dest = str(key).replace("-", "_")
            if dest not in actions:
                raise ConfigFileError(
                    f"config file {path}: unknown setting '{key}' "
                    f"(known: {', '.join(sorted(k.replace('_', '-') for k in actions))})"
                )
            try:
                defaults[dest] = _convert(actions[dest], value)
            except (TypeError, ValueError, argparse.ArgumentTypeError) as exc:
                parser.error(f"config file {path}: invalid value for '{key}': {exc}")
    for dest, action in actions.items():
        env = os.environ.get(env_prefix + dest.upper())
        if env is not None:
            try:
                defaults[dest] = _convert(action, env)
            except (TypeError, ValueError, argparse.ArgumentTypeError) as exc:
                parser.error(f"invalid value for {dest.replace('_', '-')}: {exc}")
    parser.set_defaults(**defaults)
    # Required flags satisfied by the file or environment are no longer required.
    for dest in defaults:
        if dest in actions:
            actions[dest].required = False
    return parser.parse_args(argv)


def _load(path: Path) -> Any:
    """The YAML document in ``path``; ConfigFileError in one line when it cannot be had.

    A directory (``--config /tmp``) or a file that is not UTF-8 too; PyYAML's own message
    spans several lines, so bad YAML is reported as ``FILE:LINE:COLUMN: problem``.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigFileError(f"config file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise ConfigFileError(f"config file {path} cannot be read: {reason}") from None
    try:
        return yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise ConfigFileError(f"config file {yaml_error(path, exc)}") from None


def yaml_error(path: Path | str, exc: yaml.YAMLError) -> str:
    """``exc`` in one line: ``PATH:LINE:COLUMN: is not valid YAML: problem`` (PyYAML's own
    text quotes the offending lines and spans several)."""
    mark = getattr(exc, "problem_mark", None)
    where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    return f"{where}: is not valid YAML: {problem}"


def _takes_several(action: argparse.Action) -> bool:
    return (
        isinstance(action, argparse._AppendAction)
        or action.nargs in ("*", "+")
        or (isinstance(action.nargs, int) and action.nargs > 1)
    )


def _convert(action: argparse.Action, value: Any) -> Any:
    """``value`` (from the YAML file: any YAML type; from the environment: a string) as the
    flag would have parsed it; ValueError or ArgumentTypeError saying what is wrong.

    A YAML number, boolean or list must not skip the flag's checks (``etcd: 5``, ``node-id: 1.5``,
    ``max-connections: true``): a YAML scalar is read as the same text on the command line would be;
    a boolean only for a flag that takes one (``yes`` is a boolean in YAML, so a name meant
    literally must be quoted); a list only for a flag that may be given more than once; and the
    value must be one of the flag's choices, which argparse checks on the command line only.
    """
    if _takes_several(action):
        items = value if isinstance(value, list) else [value]
        out = [_convert_one(action, item) for item in items]
        return out if isinstance(value, list) else out[0]
    return _convert_one(action, value)


def _convert_one(action: argparse.Action, value: Any) -> Any:
    takes_boolean = action.nargs == 0 or action.type is boolean
    if isinstance(value, (list, dict)):
        raise ValueError(
            f"expected one value, not {'a list' if isinstance(value, list) else 'a mapping'}"
        )
    if value is None:
        raise ValueError("no value given")
    if isinstance(value, bool) and not takes_boolean:
        name = getattr(action.type, "__name__", "")
        what = _KINDS.get(name) or action.metavar or "a value"
        raise ValueError(f"expected {what}, not the boolean {str(value).lower()}")
    if action.nargs == 0:  # --acls (store_true): the setting is the flag's value
        return boolean(str(value)) if str(value).strip() else False  # STROM_ACLS= : unset
    text = str(value).lower() if isinstance(value, bool) else str(value)
    converted = action.type(text) if action.type is not None else text
    if action.choices is not None and converted not in action.choices:
        raise ValueError(f"{text!r} is not one of {', '.join(map(str, action.choices))}")
    return converted


#: What a flag type's values are, for an error (the names of strom.argtypes' types).
_KINDS = {"int": "a whole number", "number": "a number", "float": "a number"}


def boolean(text: str) -> bool:
    """An argparse type: a yes/no setting, as flags, environment variables and YAML write it."""
    value = str(text).strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"not a boolean: {text!r}")


def split_host_port(text: str, *, what: str = "address") -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"{what} {text!r} is not HOST:PORT")
    problem = host_problem(host) if host else None
    if problem:
        raise ValueError(f"{what} {text!r}: {host!r} {problem}")
    return host or "0.0.0.0", int(port)
