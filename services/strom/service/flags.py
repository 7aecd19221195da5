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
import random
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NoReturn

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
        type=host_port,
        metavar="HOST:PORT",
        help="address clients are told to use (default: --listen, 0.0.0.0 as 127.0.0.1)",
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


def advertised(listen: str, advertise: str | None) -> tuple[str, int]:
    """The (host, port) others should dial: --advertise, else --listen with a wildcard host
    replaced by loopback."""
    host, port = split_host_port(advertise or listen)
    if host in ("0.0.0.0", "::", "[::]", ""):
        host = "127.0.0.1"
    return host, port


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
    try:
        asyncio.run(
            runtime.serve(
                service, listen, metrics_port, metrics_host=metrics_host(listen), limits=limits
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

    #: The address others dial (see :func:`advertised`).
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
    host, port = advertised(args.listen, args.advertise)
    runtime.setup_logging(args.log_level, role, args)
    return Process(
        host,
        port,
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
