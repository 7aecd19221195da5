"""Process helpers for local clusters: free ports, waiting on conditions, owned processes.

Every process is started in its own session (``start_new_session=True``) so a signal to the
test runner does not reach it by accident, and is stopped by PID.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


class ClusterError(RuntimeError):
    """A local-cluster process could not be started or did not become healthy."""


class ProcessExited(ClusterError):
    """A process a wait depends on exited: waiting longer cannot help, so :func:`wait_for`
    raises it at once instead of retrying until its timeout (found from outside: `strom dev
    up` on a data dir of another cluster waited 60 s after the node had exited, then printed
    the exit buried in a timeout message)."""


#: Listening ports are drawn below the kernel's ephemeral range (Linux: 32768-60999).
#: Asking the kernel for port 0 returns an *ephemeral* port, which the next outgoing
#: connection of any process (a gRPC client, an etcd watch) may take before our server binds
#: it: "Address already in use" at random. Ports below the range are never handed out that way.
_PORT_RANGE = (20000, 32000)
#: A narrower range within it, "LOW-HIGH", for processes that must not draw the ports
#: another one draws: the test suite gives each of its parallel workers a slice of its own
#: (tests/conftest.py), so two workers starting clusters at the same moment never both see
#: one port free and race to bind it (found in CI: "Address already in use"). Inherited by
#: the processes they start (`strom dev up`, `strom bench`), which draw their ports too.
PORTS_ENV = "STROM_DEV_PORTS"
_port_lock = threading.Lock()
_recent: set[int] = set()


def port_range() -> tuple[int, int]:
    """The range :func:`free_port` draws from: :data:`PORTS_ENV` when set, else the whole
    :data:`_PORT_RANGE`."""
    text = os.environ.get(PORTS_ENV, "").strip()
    if not text:
        return _PORT_RANGE
    low, sep, high = text.partition("-")
    if not (sep and low.strip().isdigit() and high.strip().isdigit()):
        raise ValueError(f"{PORTS_ENV}={text!r}: expected LOW-HIGH, e.g. 20000-25999")
    lo, hi = int(low), int(high)
    if not 1024 <= lo <= hi <= 65535:
        raise ValueError(f"{PORTS_ENV}={text!r}: expected 1024 <= LOW <= HIGH <= 65535")
    return lo, hi


def free_port(host: str = "127.0.0.1") -> int:
    """A port that nothing listens on now, outside the ephemeral range (see above)."""
    with _port_lock:
        span = port_range()
        for _ in range(1000):
            port = random.randint(*span)
            if port in _recent:
                continue
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind((host, port))
                except OSError:
                    continue
            _recent.add(port)
            if len(_recent) > 2000:
                _recent.clear()
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # fall back to the kernel
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether nothing listens on ``host:port`` now (a server could bind it). With
    SO_REUSEADDR, as gRPC's servers bind: the connections a stopped node left in TIME_WAIT
    do not hold its port (found: a plain bind said the port of the node `dev down` had just
    stopped was taken)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def reserve_ports(ports: Sequence[int]) -> None:
    """Keep :func:`free_port` from handing out ``ports`` (wanted by a member that binds them
    later, e.g. a storage node's port kept from the last ``strom dev up``)."""
    with _port_lock:
        _recent.update(ports)


def wait_for(
    condition: Callable[[], T | None], *, timeout: float, what: str, interval: float = 0.05
) -> T:
    """Poll ``condition`` until it returns something truthy; raise naming ``what`` on timeout.

    Polling a condition (with a short interval) is the point: callers wait for a state, not
    for a guessed duration. A condition raising :class:`ProcessExited` ends the wait at once
    with that error; any other error is retried (a process may fail to answer while it starts)
    and named in the timeout's message.
    """
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    while True:
        try:
            value = condition()
            if value:
                return value
        except ProcessExited:
            raise
        except Exception as exc:  # the condition may fail while a process is starting
            last_exc = exc
        if time.monotonic() >= deadline:
            detail = f" (last error: {last_exc!r})" if last_exc else ""
            raise ClusterError(f"timed out after {timeout:.1f}s waiting for {what}{detail}")
        time.sleep(interval)


def port_open(host: str, port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.2):
        return True
    return False


class ManagedProcess:
    """A child process with its log file, started in its own session."""

    def __init__(
        self, name: str, argv: Sequence[str], log_path: Path, env: dict[str, str] | None = None
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None
        #: Size of the log file when this process was started: the log is appended across
        #: runs, and why a start failed is in what came after (:meth:`log_since_start`).
        self.log_start = 0

    def start(self) -> ManagedProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        logf = open(self.log_path, "ab")  # noqa: SIM115 - the child keeps it open
        try:
            self.log_start = os.fstat(logf.fileno()).st_size
            self.proc = subprocess.Popen(
                self.argv,
                stdout=logf,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env={**os.environ, **(self.env or {})},
            )
        finally:
            logf.close()
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            assert self.proc is not None
            os.kill(self.proc.pid, sig)

    def kill(self) -> None:
        """SIGKILL and reap."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM, wait, then SIGKILL if it will not go."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.proc.returncode

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return ""

    def log_since_start(self, lines: int = 8) -> str:
        """The last ``lines`` lines this run wrote to the log (earlier runs' lines left out,
        as they do not say why this one stopped)."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self.log_start)
                text = f.read().decode(errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def exited(self, what: str) -> ProcessExited:
        """The error for this process having exited while ``what`` waited on it: its exit
        status and the last lines of this run's log, one per line."""
        code = self.proc.poll() if self.proc is not None else None
        status = "" if code is None else f" with status {code}"
        tail = self.log_since_start()
        said = f"; the end of its log ({self.log_path}):\n{tail}" if tail else ""
        return ProcessExited(f"{what} exited{status} during start{said}")


ETCD_INSTALL_HINT = (
    "etcd was not found on PATH. Install it with `apt-get install -y etcd-server etcd-client` "
    "(or run `make setup`, which does that), then try again."
)


class EtcdServer:
    """A single-member etcd on loopback, for local clusters and tests."""

    def __init__(
        self,
        data_dir: Path,
        client_port: int | None = None,
        peer_port: int | None = None,
        host: str = "127.0.0.1",
        tls: tuple[Path, Path, Path] | None = None,
        args: Sequence[str] = (),
    ) -> None:
        binary = shutil.which("etcd")
        if binary is None:
            raise ClusterError(ETCD_INSTALL_HINT)
        self.binary = binary
        self.host = host
        self.data_dir = data_dir
        self.client_port = client_port or free_port(host)
        self.peer_port = peer_port or free_port(host)
        #: (cert, key, CA): serve clients over TLS and require client certificates from them.
        self.tls = tls
        #: More etcd flags, after ours (tests: a small --quota-backend-bytes).
        self.args = list(args)
        self.process: ManagedProcess | None = None

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.client_port}"

    def start(self, timeout: float = 20.0) -> EtcdServer:
        scheme = "https" if self.tls else "http"
        client = f"{scheme}://{self.host}:{self.client_port}"
        peer = f"http://{self.host}:{self.peer_port}"
        argv = [
            self.binary,
            "--name",
            "strom-etcd",
            "--data-dir",
            str(self.data_dir / "etcd"),
            "--listen-client-urls",
            client,
            "--advertise-client-urls",
            client,
            "--listen-peer-urls",
            peer,
            "--initial-advertise-peer-urls",
            peer,
            "--initial-cluster",
            f"strom-etcd={peer}",
            "--log-level",
            "warn",
            # As the chart's etcd: old revisions are compacted away, not kept for ever.
            "--auto-compaction-mode",
            "periodic",
            "--auto-compaction-retention",
            "1h",
        ]
        if self.tls:
            cert, key, ca = self.tls
            argv += [
                "--cert-file",
                str(cert),
                "--key-file",
                str(key),
                "--trusted-ca-file",
                str(ca),
                "--client-cert-auth",
            ]
        argv += self.args
        self.process = ManagedProcess("etcd", argv, self.data_dir / "etcd.log").start()
        wait_for(self._healthy, timeout=timeout, what=f"etcd on {self.endpoint}")
        return self

    def _healthy(self) -> bool:
        if self.process is None:
            raise ProcessExited("etcd was not started")
        if not self.process.alive():
            raise self.process.exited("etcd")
        return port_open(self.host, self.client_port)

    def kill(self) -> None:
        if self.process:
            self.process.kill()

    def stop(self) -> None:
        if self.process:
            self.process.stop()
