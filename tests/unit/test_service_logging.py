"""The services' log handler (strom.service.runtime.setup_logging): grpc.aio's error record
for an RPC cancelled while the server stops is dropped (it put a traceback at the end of a
refused start's one-line reason), every other record goes out as one JSON line."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import sys

import pytest

from strom.service import runtime


def _log_through_handler(logger: str, message: str, exc: BaseException | None) -> list[dict]:
    """What the services' handler writes for one record (as parsed JSON lines)."""
    runtime.setup_logging("info", "test")
    root = logging.getLogger()
    handler = root.handlers[0]
    out = io.StringIO()
    handler.setStream(out)  # type: ignore[attr-defined]
    out.truncate(0)
    try:
        if exc is None:
            logging.getLogger(logger).error(message)
        else:
            try:
                raise exc
            except BaseException:
                logging.getLogger(logger).exception(message)
    finally:
        handler.setStream(sys.stderr)  # type: ignore[attr-defined]
    return [json.loads(line) for line in out.getvalue().splitlines() if line]


@pytest.fixture(autouse=True)
def _restore_root() -> object:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield None
    root.handlers[:] = handlers
    root.setLevel(level)


GRPC_MESSAGE = (
    "Exception not handled by _handle_exceptions in servicer method [/grpc.health.v1.Health/Check]"
)


def test_a_cancelled_rpc_at_a_stop_is_not_logged() -> None:
    assert _log_through_handler("grpc._cython.cygrpc", GRPC_MESSAGE, asyncio.CancelledError()) == []


def test_other_grpc_errors_and_strom_cancellations_are_logged() -> None:
    (other,) = _log_through_handler("grpc._cython.cygrpc", GRPC_MESSAGE, ValueError("boom"))
    assert other["level"] == "error" and "ValueError: boom" in other["exc"]
    (ours,) = _log_through_handler("strom.storage", "cancelled", asyncio.CancelledError())
    assert ours["logger"] == "strom.storage" and "CancelledError" in ours["exc"]


def test_the_first_line_says_the_version_and_the_settings_with_secrets_hidden(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A service's first line: its version and the effective settings in ``config`` (a
    value whose name says it is a secret is hidden; a file's path is not a secret). Before,
    it said "starting storage-node" and nothing else."""
    from argparse import Namespace

    from strom import __version__

    out = io.StringIO()
    monkeypatch.setattr(sys, "stderr", out)  # the handler writes where stderr is now
    settings = Namespace(
        etcd="e1:2379",
        data_dir="/data",
        log_level="info",
        tls_key="/etc/strom/key.pem",
        tls_key_password="hunter2",
        etcd_secret=None,
        func=print,  # a subcommand's handler: not a setting
    )
    runtime.setup_logging("info", "storage-node", settings)
    (line,) = [json.loads(x) for x in out.getvalue().splitlines() if x]
    assert line["level"] == "info" and line["logger"] == "strom"
    assert line["msg"].startswith(f"starting storage-node {__version__} (python ")
    assert line["version"] == __version__
    assert line["config"] == {
        "data_dir": "/data",
        "etcd": "e1:2379",
        "etcd_secret": None,
        "log_level": "info",
        "tls_key": "/etc/strom/key.pem",
        "tls_key_password": "<hidden>",
    }
    assert "hunter2" not in out.getvalue()


def test_the_first_line_is_written_at_any_start_level(monkeypatch: pytest.MonkeyPatch) -> None:
    """Found from outside: a service started with --log-level warn never said which version
    ran with which settings (its first line is INFO)."""
    out = io.StringIO()
    monkeypatch.setattr(sys, "stderr", out)
    runtime.setup_logging("warning", "controller")
    logging.getLogger("strom").info("an ordinary info line")
    lines = [json.loads(x) for x in out.getvalue().splitlines() if x]
    assert [x["msg"].split(" ")[:2] for x in lines] == [["starting", "controller"]]
