"""Flags and the process entry every etcd-backed service shares (storage node, controller,
coordinator).

One place for the flag types (so a bad value reads the same everywhere), the flags each such
service has (``--etcd``, ``--listen``, ``--advertise``, ``--metrics-port``, ``--cluster``,
``--max-connections``, ``--keepalive-time-ms``, ``--keepalive-timeout-ms``,
``--etcd-connect-timeout-s``, ``--log-level``, ``--config``) and
:func:`serve`, which turns the start-up problems an operator can fix into one line on stderr
instead of a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import logging
import random
import socket
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from strom import security
from strom.argtypes import cluster_name, int_at_least
from strom.grpc_options import SERVER_KEEPALIVE_TIME_MS, SERVER_KEEPALIVE_TIMEOUT_MS
from strom.metadata import MetadataUnavailableError, parse_endpoints
from strom.service import runtime
from strom.service.config import ConfigFileError, parse_with_sources, split_host_port
from strom.service.config import boolean as boolean  # a flag type; YAML values use it too
from strom.service.limits import ServerLimits
from strom.service.metrics_http import metrics_host


def host_port(text: str) -> str:
    try:
        _host, port = split_host_port(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port {port} in {text!r} is out of range")
    return text


#: The levels a service logs at (``--log-level``, ``STROM_LOG_LEVEL``, ``log-level:``).
LOG_LEVELS = ("debug", "info", "warning", "error")
#: Other names of them, as Python's logging and Kafka's log4j users write them.
_LOG_LEVEL_ALIASES = {"warn": "warning", "fatal": "error", "critical": "error"}


def log_level(text: str) -> str:
    """A flag type: a log level in any case, ``warn`` taken as ``warning`` (found from
    outside: ``--log-level warn``, as Kafka and Python users type it, was refused)."""
    name = str(text).strip().lower()
    return _LOG_LEVEL_ALIASES.get(name, name)


def endpoints(text: str) -> str:
    try:
        parse_endpoints(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def port_or_disabled(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not -1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port {value} is out of range (-1 disables metrics)")
    return value


def add_endpoint_arguments(
    parser: argparse.ArgumentParser, *, listen: str, metrics_port: int
) -> None:
    """--etcd, --listen, --advertise, --metrics-port, --cluster and the server's transport
    limits (--max-connections, --keepalive-time-ms, --keepalive-timeout-ms)."""
    parser.add_argument(
        "--etcd",
        required=True,
        type=endpoints,
        metavar="HOST:PORT[,HOST:PORT]",
        help="etcd endpoints holding the cluster metadata",
    )
    parser.add_argument(
        "--listen",
        default=listen,
        type=host_port,
        metavar="HOST:PORT",
        help="gRPC address to bind (default: %(default)s)",
    )
    parser.add_argument(
        "--advertise",
        default=None,
        type=advertise_address,
        metavar="HOST:PORT",
        help="address clients and the other services dial (default: --listen; a wildcard "
        "--listen advertises this host's name if it resolves to an address of this host, "
        "else 127.0.0.1, with a warning)",
    )
    parser.add_argument(
        "--metrics-port",
        default=metrics_port,
        type=port_or_disabled,
        help="Prometheus /metrics HTTP port, on the --listen host (a wildcard host: IPv4 and "
        "IPv6); -1 disables it (default: %(default)s)",
    )
    parser.add_argument(
        "--cluster",
        default="strom",
        type=cluster_name,
        help="cluster name: the etcd prefix /strom/<name>/",
    )
    parser.add_argument(
        "--max-connections",
        default=0,
        type=int_at_least(0),
        help="most client connections served at once; more are closed (default 0: half the "
        "open-file limit, at most 10000)",
    )
    parser.add_argument(
        "--keepalive-time-ms",
        default=SERVER_KEEPALIVE_TIME_MS,
        type=int_at_least(1000),
        help="ping a client whose connection has been quiet this long (default: %(default)s)",
    )
    parser.add_argument(
        "--keepalive-timeout-ms",
        default=SERVER_KEEPALIVE_TIMEOUT_MS,
        type=int_at_least(1000),
        help="close a connection whose client does not answer a ping within this, ending its "
        "calls and streams (default: %(default)s)",
    )


def server_limits(args: argparse.Namespace) -> ServerLimits:
    """The gRPC server's transport limits from the endpoint flags."""
    return ServerLimits(
        max_connections=args.max_connections,
        keepalive_time_ms=args.keepalive_time_ms,
        keepalive_timeout_ms=args.keepalive_timeout_ms,
    )


class OneLineParser(argparse.ArgumentParser):
    """Usage errors as one line naming the bad flag (``--help`` still shows the full usage)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def add_process_arguments(
    parser: argparse.ArgumentParser, *, etcd_connect_timeout: bool = True
) -> None:
    """--etcd-connect-timeout-s (unless ``etcd_connect_timeout`` is false: the storage node
    keeps retrying etcd instead), --log-level, the security flags and --config (add these
    last: --config names them all)."""
    if etcd_connect_timeout:
        parser.add_argument(
            "--etcd-connect-timeout-s",
            default=10.0,
            type=float,
            help="give up starting when etcd does not answer within this (default: %(default)s)",
        )
    parser.add_argument(
        "--log-level",
        default="info",
        type=log_level,
        choices=LOG_LEVELS,
        help="log level, set at start only (warn is warning; any case; default: %(default)s)",
    )
    security.add_arguments(parser)
    parser.add_argument("--config", metavar="FILE", help="YAML file with any of these settings")


#: Listen hosts that mean every interface: nobody can dial them, so a service listening on
#: one advertises another address (see :func:`advertised_address`). ``:9092`` splits to 0.0.0.0.
WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::", "[::]"})

#: What a wildcard --listen advertises when this host's name is not usable: the dev default
#: of one machine, where every process dials the others over loopback.
LOOPBACK = "127.0.0.1"


def advertise_address(text: str) -> str:
    """A flag type for ``--advertise``: HOST:PORT, never a wildcard. Others dial this
    address, and 0.0.0.0 or [::] cannot be dialled (Kafka refuses advertising 0.0.0.0 too)."""
    text = host_port(text)
    host, _port = split_host_port(text)
    if host in WILDCARD_HOSTS:
        raise argparse.ArgumentTypeError(_wildcard_advertise(text))
    return text


def _wildcard_advertise(text: str) -> str:
    return (
        f"--advertise {text!r} is a wildcard, which nobody can dial: give the name or "
        "address other processes reach this one at"
    )


@dataclass(frozen=True)
class Advertised:
    """The address a service registers for others to dial, and why, when it was guessed."""

    host: str
    port: int
    #: The start-up WARNING for an address chosen without ``--advertise`` for a wildcard
    #: ``--listen``; None when the flags named it.
    warning: str | None = None


def _resolve(name: str, family: int) -> list[tuple[int, tuple[Any, ...]]]:
    """(family, sockaddr) of every address ``name`` resolves to here; [] when it does not."""
    try:
        infos = socket.getaddrinfo(name, None, family, socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return []
    return [(fam, addr) for fam, _type, _proto, _canon, addr in infos]


def _is_local(family: int, sockaddr: tuple[Any, ...]) -> bool:
    """Whether ``sockaddr`` is an address of this host: only those can be bound (a name that
    resolves to another machine's address would send every client there)."""
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.bind((sockaddr[0], 0, *sockaddr[2:]))
    except OSError:
        return False
    return True


def _host_names() -> list[str]:
    """This host's canonical name (``socket.getfqdn()``, Kafka's choice for an empty
    listener host: in a StatefulSet pod it is the name under the headless Service), then its
    plain name (``socket.gethostname()``, what ``hostname`` prints; the canonical one is
    ``localhost`` where the name maps to 127.0.0.1)."""
    names = [socket.getfqdn(), socket.gethostname()]
    return list(dict.fromkeys(n for n in names if n))


def wildcard_host(
    listen_host: str,
    *,
    names: Sequence[str] | None = None,
    resolve: Callable[[str, int], list[tuple[int, tuple[Any, ...]]]] = _resolve,
    is_local: Callable[[int, tuple[Any, ...]], bool] = _is_local,
) -> tuple[str, str]:
    """(host to advertise, why) for a wildcard ``--listen`` without ``--advertise``.

    The first of this host's names (:func:`_host_names`) whose every address here is a
    non-loopback address of this host (an IPv4 one for a 0.0.0.0 listener, which takes no
    IPv6): in a container, a pod or a VM that is the address other hosts reach it at, where
    127.0.0.1 sent them to their own loopback. Else 127.0.0.1, the reason naming the plain
    name: a laptop's name usually maps to 127.0.1.1, and one machine is then all there is,
    as ``strom dev up`` runs it."""
    names = list(names) if names is not None else _host_names()
    family = socket.AF_INET if listen_host == "0.0.0.0" else socket.AF_UNSPEC
    why = "this host has no name"
    for name in names:
        problem = _name_problem(name, family, resolve, is_local)
        if problem is None:
            return name, "this host's name"
        why = f"this host's name {name!r} {problem}"
    return LOOPBACK, why


def _name_problem(
    name: str,
    family: int,
    resolve: Callable[[str, int], list[tuple[int, tuple[Any, ...]]]],
    is_local: Callable[[int, tuple[Any, ...]], bool],
) -> str | None:
    """Why ``name`` cannot be advertised for a listener of ``family``; None when it can."""
    addresses = resolve(name, family)
    if not addresses:
        return "resolves to no " + ("IPv4 address" if family == socket.AF_INET else "address")
    for fam, sockaddr in addresses:
        ip = ipaddress.ip_address(str(sockaddr[0]).partition("%")[0])
        if ip.is_loopback:
            return f"resolves to loopback {ip}"
        if not is_local(fam, sockaddr):
            return f"resolves to {ip}, not an address of this host"
    return None


def advertised_address(listen: str, advertise: str | None) -> Advertised:
    """What others should dial: ``--advertise``, else ``--listen`` with a wildcard host
    replaced by :func:`wildcard_host`, with the warning saying so. ValueError for a
    wildcard ``--advertise`` (a namespace built without the flag type)."""
    if advertise:
        host, port = split_host_port(advertise, what="--advertise")
        if host in WILDCARD_HOSTS:
            raise ValueError(_wildcard_advertise(advertise))
        return Advertised(host, port)
    host, port = split_host_port(listen, what="--listen")
    if host not in WILDCARD_HOSTS:
        return Advertised(host, port)
    chosen, why = wildcard_host(host)
    if chosen == LOOPBACK:
        warning = (
            f"--listen {listen} is every interface and --advertise is not set: advertising "
            f"{chosen}:{port}, which only processes on this host can dial ({why}); on more "
            "than one host (containers, pods, VMs) set --advertise HOST:PORT to the name or "
            "address the others reach this one at"
        )
    else:
        warning = (
            f"--listen {listen} is every interface and --advertise is not set: advertising "
            f"{chosen}:{port} ({why}); every client and service must resolve it to this "
            "host, else set --advertise HOST:PORT"
        )
    return Advertised(chosen, port, warning)


def warn_advertised(warning: str | None, host: str, port: int) -> None:
    """Log the ``warning`` of a guessed address ``host:port`` once logging is set up: on
    several hosts, a silent 127.0.0.1 has every other process dial its own loopback."""
    if warning:
        logging.getLogger("strom.service").warning(
            "%s", warning, extra={"fields": {"advertised": f"{host}:{port}"}}
        )


def fail(prog: str, message: str, code: int = 1) -> int:
    print(f"{prog}: error: {message}", file=sys.stderr)
    return code


def serve(
    prog: str,
    service: runtime.Service,
    listen: str,
    metrics_port: int | None,
    startup_errors: tuple[type[BaseException], ...],
    limits: ServerLimits,
    *,
    etcd: str | None = None,
) -> int:
    """Run ``service`` until SIGTERM; the exit code. Start-up problems -> one stderr line.

    ``etcd`` (the endpoints) is named in the line when etcd cannot be reached, for services
    whose own start-up errors do not name it already.
    """
    host, port = split_host_port(listen)
    bind = f"{host}:{port}"  # gRPC refuses ":PORT", which --listen takes as 0.0.0.0:PORT
    try:
        asyncio.run(
            runtime.serve(
                service, bind, metrics_port, metrics_host=metrics_host(listen), limits=limits
            )
        )
    except startup_errors as exc:
        return fail(prog, str(exc))
    except MetadataUnavailableError as exc:
        return fail(prog, f"cannot reach etcd at {etcd}: {exc}" if etcd else str(exc))
    except OSError as exc:  # a port in use, an unusable data directory
        return fail(prog, str(exc))
    except RuntimeError as exc:
        # grpc raises RuntimeError("Failed to bind to address ...") for a port in use.
        if "bind" in str(exc).lower():
            return fail(prog, f"cannot listen on {listen}: {exc}")
        raise
    except KeyboardInterrupt:
        return 130
    return 0


def configure_security(prog: str, args: argparse.Namespace) -> int | None:
    """Install the security flags; an exit code (after one stderr line) when they are bad."""
    try:
        check_services_authenticate(args)
        security.configure(args)
    except ValueError as exc:
        return fail(prog, str(exc), 2)
    return None


def check_services_authenticate(args: argparse.Namespace) -> None:
    """ValueError when the services could not pass each other's checks. A service
    authenticates to another with its certificate under mTLS (``--tls-client-auth
    required``: without it the listeners do not ask for one) or with
    ``--client-token-file``. Without either it calls the others as User:ANONYMOUS, so with
    ``--acls`` every internal call (a follower's fetches, the controller's LeaderAndIsr, a
    coordinator's writes) is denied, and with ``--auth-tokens`` / ``--auth-token-verifier``
    it is refused as unauthenticated: a cluster that starts and never works (found from
    outside)."""
    mtls = (getattr(args, "tls_client_auth", None) or "none") == "required"
    if mtls or getattr(args, "client_token_file", None):
        return
    how = (
        "use mTLS (--tls-cert, --tls-key, --tls-ca and --tls-client-auth required) or a "
        "service token (--client-token-file, its principal in --auth-tokens)"
    )
    if getattr(args, "acls", False):
        raise ValueError(
            "--acls needs the services to authenticate to each other, else their own calls "
            f"run as User:ANONYMOUS and are denied: {how}, and put that principal in "
            "--super-users"
        )
    tokens = [f for f in ("auth_tokens", "auth_token_verifier") if getattr(args, f, None)]
    if tokens:
        flag = "--" + tokens[0].replace("_", "-")
        raise ValueError(
            f"{flag} makes every caller authenticate, the services' calls to each other "
            f"too, and they present nothing: {how}"
        )


@dataclass(frozen=True)
class Process:
    """Where a controller or coordinator process listens and who it is, from its flags."""

    #: The address others dial (see :func:`advertised_address`).
    host: str
    port: int
    #: ``--controller-id`` / ``--coordinator-id``, or a random one when not given.
    ident: int
    #: The /metrics port; None when disabled (``--metrics-port -1``).
    metrics_port: int | None


def start_process(
    prog: str, args: argparse.Namespace, role: str, ident: int | None
) -> Process | int:
    """The common first steps of a service's ``run``: the security flags, the advertised
    address, the process id and the log setup; an exit code when the flags are bad."""
    failed = configure_security(prog, args)
    if failed is not None:
        return failed
    try:
        address = advertised_address(args.listen, args.advertise)
    except ValueError as exc:  # a namespace built without the flag types
        return fail(prog, str(exc), 2)
    runtime.setup_logging(args.log_level, role, args)
    warn_advertised(address.warning, address.host, address.port)
    return Process(
        address.host,
        address.port,
        ident if ident is not None else random.randrange(1 << 31),
        args.metrics_port if args.metrics_port >= 0 else None,
    )


def standalone(
    prog: str,
    parser: argparse.ArgumentParser,
    run: Callable[[argparse.Namespace], int],
    argv: Sequence[str] | None,
) -> int:
    """A service as a program of its own: flags > STROM_* environment > ``--config`` YAML,
    then ``run``; a config file that cannot be read or parsed is one stderr line and exit 2,
    a usage error as a malformed flag is, the same for every service."""
    try:
        args = parse_with_sources(parser, argv)
    except ConfigFileError as exc:
        return fail(prog, str(exc), 2)
    return run(args)
