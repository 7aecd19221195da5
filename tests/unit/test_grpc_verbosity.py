"""``import strom`` keeps gRPC's C core from writing its INFO lines to an application's stderr
(found from outside: ``I1130 ... chttp2_transport.cc:1403] ... Got goaway`` in a program that
only did ``from strom import Consumer``), while a GRPC_VERBOSITY the user set still wins."""

from __future__ import annotations

import os
import subprocess
import sys

#: A child that imports strom (or not), then has a channel try to connect. With gRPC's
#: connectivity tracer on, the C core logs each state change at INFO, through the same
#: verbosity gate as the GOAWAY line (which is racy to provoke: a closing server does not
#: always get its GOAWAY read before the socket is gone).
CHILD = """
import sys
if sys.argv[1] == "strom":
    from strom import Consumer  # noqa: F401  (what an application does first)
import os

import grpc

channel = grpc.insecure_channel("127.0.0.1:1")  # nothing listens there
try:
    grpc.channel_ready_future(channel).result(timeout=0.5)
except grpc.FutureTimeoutError:
    pass
channel.close()
print(os.environ.get("GRPC_VERBOSITY"))
"""


def _run(mode: str, verbosity: str | None) -> tuple[str, str]:
    """The child's (stdout, stderr), with GRPC_VERBOSITY as given (None: unset)."""
    env = {k: v for k, v in os.environ.items() if k != "GRPC_VERBOSITY"}
    env["GRPC_TRACE"] = "connectivity_state"
    if verbosity is not None:
        env["GRPC_VERBOSITY"] = verbosity
    done = subprocess.run(
        [sys.executable, "-c", CHILD, mode],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout.strip(), done.stderr


def test_without_strom_the_c_core_writes_info_lines() -> None:
    """The child provokes the line at all (else the next test would prove nothing)."""
    out, err = _run("plain", None)
    assert out == "None"
    assert "connectivity" in err, err


def test_importing_strom_silences_the_c_core_info_lines() -> None:
    out, err = _run("strom", None)
    assert out == "ERROR"
    assert err == ""


def test_a_verbosity_the_user_set_wins() -> None:
    out, err = _run("strom", "INFO")
    assert out == "INFO"
    assert "connectivity" in err, err
