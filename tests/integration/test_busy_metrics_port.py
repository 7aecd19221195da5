"""A service whose --metrics-port is taken exits with one line naming the port.

Found from outside: a busy metrics port ended the process with a bare ``error: [Errno 98]
Address already in use`` (which of the two ports?), and a storage node's exit then printed
``Error in sys.excepthook: / Original exception was:``: the node kept its gRPC server alive
past serve(), so gRPC's poller thread was still running into interpreter shutdown.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from strom.devcluster.procs import free_port

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("service", ["storage-node", "coordinator", "controller"])
def test_a_busy_metrics_port_is_one_line_naming_it(service: str, tmp_path: Path) -> None:
    extra = ["--node-id", "1", "--data-dir", str(tmp_path / "data")]
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        out = subprocess.run(
            [sys.executable, "-m", "strom.cli.main", service]
            + (extra if service == "storage-node" else [])
            + ["--etcd", f"127.0.0.1:{free_port()}", "--listen", f"127.0.0.1:{free_port()}"]
            + ["--metrics-port", str(port)],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "PYTHONWARNINGS": "ignore"},
        )
    assert out.returncode == 1, out.stderr
    # The JSON log lines aside ("starting ..."), one line: the error.
    lines = [line for line in out.stderr.splitlines() if not line.startswith("{")]
    assert lines == [
        f"strom {service}: error: cannot serve metrics on 127.0.0.1:{port}: Address already in use"
    ], out.stderr
