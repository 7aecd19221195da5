"""``python -m strom.service.healthcheck [--service NAME] [HOST:PORT ...]``: exit 0 when a
strom service on this machine answers gRPC health checking (``grpc.health.v1``) with SERVING,
else 1. ``--service strom.ready`` asks for readiness instead of "started" (a storage node is
ready once it is back in its partitions' ISRs): the chart's TLS readiness probes.

The container image's HEALTHCHECK for ``docker run`` / Compose (Kubernetes ignores image
health checks and uses the chart's gRPC probes instead). Without arguments it checks
``$STROM_HEALTHCHECK_ADDRESS``, else ``$STROM_LISTEN`` (a wildcard host means loopback), else
the default ports of the three roles (9092, 9093, 9094) and passes if any of them serves.
With TLS it uses the service's own files (see :func:`security`): the chart's probes run it
when TLS is on, as Kubernetes' gRPC probes cannot speak TLS. It tests the service, not the
files: with files on disk that a service would refuse (a bad renewal, which every service
keeps serving through with the files it read before), it still asks the health service with
them, and if that cannot work (an mTLS listener refusing an expired client certificate) it
passes when the service's TLS listener answers a handshake; the output says why.
``StromTLSFilesInvalid`` is what reports bad files.
"""

from __future__ import annotations

import os
import socket
import ssl
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from strom.security.channel import ChannelSecurity

DEFAULT_ADDRESSES = ("127.0.0.1:9092", "127.0.0.1:9093", "127.0.0.1:9094")


def addresses(argv: Sequence[str], env: dict[str, str]) -> list[str]:
    if argv:
        return list(argv)
    explicit = env.get("STROM_HEALTHCHECK_ADDRESS") or env.get("STROM_LISTEN")
    if explicit:
        host, _, port = explicit.rpartition(":")
        if host in ("", "0.0.0.0", "::", "[::]"):
            host = "127.0.0.1"
        return [f"{host}:{port}"]
    return list(DEFAULT_ADDRESSES)


#: The variables each source of TLS files is read from (CA, certificate, key): the client
#: settings if given, else the service's own files.
CLIENT_FILES = ("STROM_SSL_CAFILE", "STROM_SSL_CERTFILE", "STROM_SSL_KEYFILE")
SERVICE_FILES = ("STROM_TLS_CA", "STROM_TLS_CERT", "STROM_TLS_KEY")


@dataclass(frozen=True)
class ProbeSecurity:
    """How the probe dials, and what is wrong with the TLS files on disk (None: nothing).

    ``problem`` does not stop the probe: the service keeps the files it read before when a
    renewal is bad (:mod:`strom.security.tls_reload`), so bad files on disk say nothing
    about whether it serves."""

    sec: ChannelSecurity
    problem: str | None = None
    #: Whether TLS files were configured at all (even unusable ones): the listener speaks TLS.
    tls: bool = False


def security(env: dict[str, str]) -> ProbeSecurity:
    """How to reach the local service: the client settings (``STROM_SSL_*``) if given, else
    the service's own TLS files (``STROM_TLS_CA`` / ``_CERT`` / ``_KEY``: its own certificate
    passes an mTLS listener), else plaintext.

    The files are not checked as a client checks them: the chart's probes run with the
    mounted Secret the services share, so one bad renewal (which every service refuses while
    serving on with its old files) would fail every pod's probe and have them all killed.
    They are used as they are: an expired certificate is still presented
    (the server decides), one whose key is not its own is left out, and what is wrong goes
    into ``problem`` (``StromTLSFilesInvalid`` is what reports it)."""
    names = CLIENT_FILES if env.get("STROM_SSL_CAFILE") else SERVICE_FILES
    paths = tuple(env.get(n) or None for n in names)
    if not any(paths):
        return ProbeSecurity(ChannelSecurity())
    token = None
    if names == CLIENT_FILES:
        token = _client_token(env)
    problems: list[str] = []
    ca, cert, key = (
        _read_raw(path, name, problems) for path, name in zip(paths, names, strict=True)
    )
    if ca is not None and not _is_ca_bundle(ca):
        problems.append(f"{names[0]} {paths[0]}: no PEM certificate in it")
        ca = None
    if (cert is None) != (key is None) or not _pair_loads(paths[1], paths[2]):
        cert = key = None  # gRPC cannot make a channel with them: dial without
    if not problems:
        problems.extend(_file_problems(names, paths))
    return ProbeSecurity(ChannelSecurity(ca, cert, key, token), "; ".join(problems) or None, True)


def _client_token(env: dict[str, str]) -> str | None:
    """``STROM_TOKEN``, else the contents of ``STROM_TOKEN_FILE`` (None if unreadable)."""
    if env.get("STROM_TOKEN"):
        return env["STROM_TOKEN"]
    if env.get("STROM_TOKEN_FILE"):
        try:
            return Path(env["STROM_TOKEN_FILE"]).read_text().strip() or None
        except (OSError, UnicodeDecodeError):
            return None
    return None


def _read_raw(path: str | None, name: str, problems: list[str]) -> bytes | None:
    if path is None:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        problems.append(f"{name} {path}: cannot read it: {exc.strerror or exc}")
        return None


def _is_ca_bundle(ca: bytes) -> bool:
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cadata=ca.decode("latin-1"))
    except (ssl.SSLError, ValueError):
        return False
    return True


def _pair_loads(cert_path: str | None, key_path: str | None) -> bool:
    """Whether the certificate and key files make a usable pair (whatever their dates)."""
    if cert_path is None or key_path is None:
        return True
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_cert_chain(
            cert_path, key_path, password=lambda: b""
        )
    except (OSError, ssl.SSLError, ValueError):
        return False
    return True


def _file_problems(names: tuple[str, ...], paths: tuple[str | None, ...]) -> list[str]:
    """What the service's own checks find wrong with the files (the ones a service refuses
    a renewal for), named by the variables they came from."""
    from strom.security.config import _check_pem

    try:
        ca, cert, key = (Path(p).read_bytes() if p else None for p in paths)
        _check_pem(
            cert, key, ca, (names[1], names[2], names[0]), (paths[1], paths[2], paths[0]), True
        )
    except OSError as exc:  # replaced since it was read
        return [f"cannot read {exc.filename}: {exc.strerror or exc}"]
    except ValueError as exc:
        return [str(exc)]
    return []


def tls_answers(address: str, timeout: float = 2.0) -> bool:
    """Whether a TLS server answers the handshake at ``address``: its side of the handshake
    arrives, or an alert from it (a client certificate required). Not verified, no client
    certificate: the probe's fallback when the files on disk cannot be used to ask the
    health service (an mTLS listener refuses an expired client certificate)."""
    host, _, port = address.rpartition(":")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["h2"])
    try:
        with (
            socket.create_connection((host.strip("[]"), int(port)), timeout=timeout) as raw,
            context.wrap_socket(raw) as tls,
        ):
            return tls.getpeercert(binary_form=True) is not None
    except ssl.SSLError as exc:
        return "ALERT" in str(exc.reason or "").upper()
    except (OSError, ValueError):
        return False


def own_name(env: dict[str, str]) -> str | None:
    """The name to verify the local service's certificate against: the first DNS name of
    the service's own certificate (``STROM_TLS_CERT``, the one it serves) that is not a
    wildcard, since a pod's certificate names its DNS names, not 127.0.0.1 (found from
    outside: the chart's TLS probes failed for such a certificate). With wildcards only, the
    first gets a label of ours. None without any (the address itself is verified then)."""
    path = env.get("STROM_TLS_CERT")
    if not path or env.get("STROM_SSL_CAFILE"):
        return None
    try:
        from cryptography import x509

        cert = x509.load_pem_x509_certificate(Path(path).read_bytes())
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        names = san.get_values_for_type(x509.DNSName)
    except (OSError, ValueError, x509.ExtensionNotFound):
        return None
    plain = [n for n in names if not n.startswith("*.")]
    if plain:
        return plain[0]
    return "probe" + names[0][1:] if names else None


def serving(
    address: str,
    timeout: float = 2.0,
    sec: ChannelSecurity | None = None,
    server_name: str | None = None,
    service: str = "",
) -> bool:
    options = [("grpc.ssl_target_name_override", server_name)] if server_name else []
    with (sec or ChannelSecurity()).channel(address, options) as channel:
        try:
            resp = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=timeout
            )
        except grpc.RpcError:
            return False
    return resp.status == health_pb2.HealthCheckResponse.SERVING


def main(argv: Sequence[str] | None = None) -> int:
    env = dict(os.environ)
    args = list(sys.argv[1:] if argv is None else argv)
    service = ""
    if args[:1] == ["--service"]:
        if len(args) < 2:
            print("--service needs a health service name (e.g. strom.ready)", file=sys.stderr)
            return 2
        service, args = args[1], args[2:]
    targets = addresses(args, env)
    probe = security(env)
    sec = probe.sec
    name = own_name(env) if sec.tls else None
    for address in targets:
        if serving(address, sec=sec, server_name=name, service=service):
            print(f"{address}: SERVING")
            return 0
    if probe.problem is not None and probe.tls:
        # The service may well serve with the files it read before: what the probe checks
        # is that it is up, not that the files on disk are good.
        for address in targets:
            if tls_answers(address):
                print(
                    f"{address}: SERVING (its TLS listener answers; the health service could "
                    f"not be asked with the TLS files on disk: {probe.problem})"
                )
                return 0
    why = f" (the TLS files on disk: {probe.problem})" if probe.problem else ""
    print(f"not serving: {', '.join(targets)}{why}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
