"""Log levels changed on running services through the cluster's dynamic configs (Kafka's
dynamic broker loggers): every service follows ``log.level`` / ``log.level.<logger>`` from
etcd without a restart, and a deleted config puts the start level back. Real processes,
their real log files."""

from __future__ import annotations

from typing import Any

import pytest

from strom import Admin
from tests.conftest import create_topic

from .test_cluster_cli import strom
from .test_service_logs import log_size, matching, wait_logged

pytestmark = pytest.mark.integration


def test_every_service_follows_the_dynamic_log_level_and_goes_back(make_cluster: Any) -> None:
    """Before, the level was set at start only: seeing more (or less) of a running service
    took a restart, which often ends what one wanted to look at."""
    cluster = make_cluster(nodes=1, controllers=1, coordinators=1)
    members = cluster.members  # a controller, a storage node, a coordinator
    assert len(members) == 3
    controller = cluster.controllers[0]
    create_topic(cluster, "before")
    wait_logged(controller, r"^created topic before ")  # INFO lines at the start level

    since = {id(m): log_size(m) for m in members}
    b = cluster.bootstrap
    got = strom("cluster", "configs", "--set", "log.level=WARN", "-b", b).stdout.decode()
    assert "set log.level=warning" in got, got  # as stored
    for m in members:
        wait_logged(m, r"log levels changed by the dynamic configs: root=warning$", since[id(m)])
    listed = strom("cluster", "configs", "-b", b).stdout.decode()
    assert "log.level=warning\t(dynamic_node)" in listed, listed

    create_topic(cluster, "quiet")  # the controller logs it at INFO before it answers
    assert not matching(controller, r"^created topic quiet ", since[id(controller)])

    since = {id(m): log_size(m) for m in members}
    strom("cluster", "configs", "--delete", "log.level", "-b", b)
    for m in members:
        wait_logged(m, r"root=info \(as at start\)$", since[id(m)])
    create_topic(cluster, "loud")
    wait_logged(controller, r"^created topic loud ", since[id(controller)])

    # One logger only: the controller's own lines go quiet, the root stays as it was.
    since = {id(m): log_size(m) for m in members}
    with Admin(b) as admin:
        admin.alter_node_configs(set={"log.level.strom.controller": "error"})
        assert admin.describe_node_configs()["log.level.strom.controller"].value == "error"
    wait_logged(controller, r"strom\.controller=error$", since[id(controller)])
    create_topic(cluster, "narrow")
    assert not matching(controller, r"^created topic narrow ", since[id(controller)])


def test_bad_log_level_configs_are_refused_clearly(make_cluster: Any) -> None:
    cluster = make_cluster(nodes=1, controllers=1, coordinators=0)
    b = cluster.bootstrap
    for setting, words in [
        ("log.level=loud", "config 'log.level' has invalid value 'loud'"),
        ("log.level.=debug", "config 'log.level.' names no logger"),
    ]:
        bad = strom("cluster", "configs", "--set", setting, "-b", b, check=False)
        err = bad.stderr.decode()
        assert bad.returncode == 2 and words in err, err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    with Admin(b) as admin:
        assert admin.describe_node_configs()["log.level"].value is None
