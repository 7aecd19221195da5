"""The CLI gives each attempt of a controller call well more time than the controller itself
waits before it answers (no cluster runs here: the controller call is recorded and refused)."""

from __future__ import annotations

from typing import Any

import pytest

from strom.cli.main import main
from strom.client.cluster import ClusterClient
from strom.controller.core import VIEW_WAIT_S
from strom.errors import BrokerNotAvailableError


@pytest.mark.parametrize(
    "argv",
    [
        ["topics", "create", "t", "--partitions", "1", "--replication-factor", "1"],
        ["acls", "add", "--allow", "User:a", "--operation", "read", "--topic", "t"],
        ["quotas", "list"],
        ["cluster", "describe"],
    ],
    ids=lambda argv: " ".join(argv[:2]),
)
def test_a_controller_attempt_of_the_cli_outlasts_the_controllers_view_wait(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    """Found from outside: `strom topics create` gave an attempt 10 s, the controller's own
    wait for its view (VIEW_WAIT_S): an attempt cut off just before the answer was retried
    and reported TOPIC_ALREADY_EXISTS for the topic the same command had just created."""
    attempts: list[float] = []

    def controller_call(
        self: ClusterClient,
        method: str,
        request: Any,
        *,
        timeout_s: float | None = None,
        retry_s: float | None = None,
    ) -> Any:
        attempt = self.timeout_s if timeout_s is None else timeout_s
        budget = self.retry_s if retry_s is None else retry_s
        attempts.append(min(attempt, budget))
        raise BrokerNotAvailableError("no controller in this test")

    monkeypatch.setattr(ClusterClient, "controller_call", controller_call)
    assert main([*argv, "--bootstrap", "127.0.0.1:1"]) == 1
    assert "no controller in this test" in capsys.readouterr().err
    assert attempts, "the command made no controller call"
    assert min(attempts) >= 2 * VIEW_WAIT_S
