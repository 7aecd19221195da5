"""Fixtures that start real processes (etcd, strom services) on free loopback ports."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from strom.devcluster.procs import EtcdServer


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EtcdServer]:
    server = EtcdServer(tmp_path).start()
    try:
        yield server
    finally:
        server.kill()
