"""``python -m strom.service.healthcheck [--service NAME] [HOST:PORT ...]``: exit 0 when a
strom service on this machine answers gRPC health checking (``grpc.health.v1``) with SERVING,
else 1. ``--service strom.ready`` asks for readiness instead of "started" (a storage node is
ready once it is back in its partitions' ISRs): the chart's TLS readiness probes.

The container image's HEALTHCHECK for ``docker run`` / Compose (Kubernetes ignores image
health checks and uses the chart's gRPC probes instead). Without arguments it checks
``$STROM_HEALTHCHECK_ADDRESS``, else ``$STROM_LISTEN`` (a wildcard host means loopback), else
the default ports of the three roles (9092, 9093, 9094) and passes if any of them serves.
With TLS it uses the service's own files (see :func:`security`): the chart's probes run it
when TLS is on, as Kubernetes' gRPC probes cannot speak TLS.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from strom.security.channel import ChannelSecurity, client_security

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


def security(env: dict[str, str]) -> ChannelSecurity:
    """How to reach the local service: the client settings (``STROM_SSL_*``) if given, else
    the service's own TLS files (``STROM_TLS_CA`` / ``_CERT`` / ``_KEY``: its own certificate
    passes an mTLS listener), else plaintext."""
    if env.get("STROM_SSL_CAFILE"):
        return client_security()
    if env.get("STROM_TLS_CA") or env.get("STROM_TLS_CERT"):
        return ChannelSecurity.from_files(
            env.get("STROM_TLS_CA") or None,
            env.get("STROM_TLS_CERT") or None,
            env.get("STROM_TLS_KEY") or None,
        )
    return ChannelSecurity()


def own_name(env: dict[str, str]) -> str | None:
    """The name to verify the local service's certificate against: the first DNS name of
    the service's own certificate (``STROM_TLS_CERT``, the one it serves), since a pod's
    certificate names its DNS names, not 127.0.0.1 (found from outside: the chart's TLS
    probes failed for such a certificate). A wildcard gets a label of ours. None without
    one (the address itself is verified then)."""
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
    try:
        sec = security(env)
    except (OSError, ValueError) as exc:  # a missing, unreadable or expired TLS file
        print(f"not serving: cannot use the TLS files: {exc}", file=sys.stderr)
        return 1
    name = own_name(env) if sec.tls else None
    for address in targets:
        if serving(address, sec=sec, server_name=name, service=service):
            print(f"{address}: SERVING")
            return 0
    print(f"not serving: {', '.join(targets)}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
