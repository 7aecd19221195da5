"""What an operator used to Kafka's tools meets with ``strom`` against a real cluster without
``--acls`` (found from outside, as a Kafka operator): ACL calls accepted where nothing enforces
them, null keys and values printed as empty ones, and records the topic allows that
``strom produce`` could not send."""

from __future__ import annotations

import pytest

from strom.client import Admin
from strom.devcluster.cluster import LocalCluster

from .test_cluster_cli import strom

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def bootstrap(one_node_cluster: LocalCluster) -> str:
    with Admin(one_node_cluster.bootstrap) as admin:
        admin.create_topic("op-hk", partitions=1, replication_factor=1)
    return one_node_cluster.bootstrap


def _one_error_line(stderr: bytes) -> str:
    lines = stderr.decode().strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr.decode(), stderr.decode()
    return lines[0]


@pytest.mark.parametrize(
    "argv",
    [
        ["add", "--deny", "User:*", "--operation", "all", "--topic", "op-hk"],
        ["remove", "--principal", "User:*"],
        ["list"],
    ],
    ids=lambda argv: argv[0],
)
def test_acl_calls_fail_on_a_cluster_that_does_not_enforce_them(
    bootstrap: str, argv: list[str]
) -> None:
    """Found from outside: `acls add --deny 'User:*' --operation all --topic hk` printed
    `added: ...` (exit 0) on a cluster without --acls, and producing to hk went on. Kafka's
    tool fails with SecurityDisabledException there; so does strom now."""
    got = strom("acls", *argv, "-b", bootstrap, check=False)
    assert got.returncode == 1, got
    line = _one_error_line(got.stderr)
    assert "SECURITY_DISABLED: ACLs are not enforced on this cluster" in line
    assert "--acls" in line
    assert got.stdout == b""
    # Nothing was stored: producing still works, as it did, and no entry waits in etcd for
    # a later --acls to surprise anyone.
    strom("produce", "op-hk", "-b", bootstrap, stdin=b"still open\n")


def test_acls_apply_fails_too(bootstrap: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    f = tmp_path / "acls.yaml"
    f.write_text("- principal: User:alice\n  allow: [read]\n  topic: op-hk\n")
    got = strom("acls", "apply", str(f), "-b", bootstrap, check=False)
    assert got.returncode == 1
    assert "SECURITY_DISABLED" in _one_error_line(got.stderr)
