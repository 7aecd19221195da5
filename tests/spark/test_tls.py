"""The connector against a cluster with TLS, client certificates and ACLs (``strom dev up
--tls``), dialling with the ``ssl.*`` options alone: no STROM_SSL_* in the environment of the
driver or of Spark's Python workers (found from outside: only that environment worked)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from strom.client.admin import Admin
from strom.client.producer import Producer
from strom.devcluster.cluster import LocalCluster

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalCluster, dict]]:
    for var in ("STROM_SSL_CAFILE", "STROM_SSL_CERTFILE", "STROM_SSL_KEYFILE", "STROM_TOKEN"):
        assert var not in os.environ, var
    cluster = LocalCluster(Path(tmp_path_factory.mktemp("spark-tls")), nodes=1, tls=True)
    try:
        cluster.start()
        files = cluster.tls_files
        client = {
            "ssl_cafile": files["ca"],
            "ssl_certfile": files["cert"],
            "ssl_keyfile": files["key"],
        }
        with Admin(cluster.bootstrap, **client) as admin:
            admin.create_topic("secure-in", partitions=1, replication_factor=1)
            admin.create_topic("secure-out", partitions=1, replication_factor=1)
        with Producer(cluster.bootstrap, acks="all", **client) as producer:
            for i in range(3):
                producer.send("secure-in", b"v%d" % i).result(timeout=30)
        options = {
            "bootstrap": cluster.bootstrap,
            "ssl.cafile": files["ca"],
            "ssl.certfile": files["cert"],
            "ssl.keyfile": files["key"],
        }
        yield cluster, options
    finally:
        cluster.kill()


def test_reads_and_writes_with_the_ssl_options(spark: Any, secure) -> None:  # type: ignore[no-untyped-def]
    _, options = secure
    df = spark.read.format("strom").options(**options).option("subscribe", "secure-in").load()
    assert sorted(bytes(r.value) for r in df.select("value").collect()) == [b"v0", b"v1", b"v2"]
    df.select("value").write.format("strom").options(**options).option("topic", "secure-out").mode(
        "append"
    ).save()
    out = spark.read.format("strom").options(**options).option("subscribe", "secure-out").load()
    assert out.count() == 3
