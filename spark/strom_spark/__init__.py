"""strom for PySpark: ``spark.read.format("strom")``, ``readStream``, ``write``, ``writeStream``.

    from strom_spark import register

    register(spark)  # the short name "strom", and filter pushdown on
    df = (
        spark.read.format("strom")
        .option("bootstrap", "127.0.0.1:9092")
        .option("subscribe", "clicks")
        .load()
    )

Options and the output schema are those of Spark's Kafka source and sink (see the README's
Spark section); no JVM jar is involved (PySpark 4's Python Data Source API, DESIGN §9).
"""

from __future__ import annotations

from typing import Any

from strom_spark.errors import DataLossError, OptionError, StromSparkError
from strom_spark.progress import lag, total_lag
from strom_spark.schema import arrow_schema, spark_schema
from strom_spark.source import StromDataSource
from strom_spark.workers import WorkerPythonError, check_worker_python, worker_python

#: The Spark setting a reader with pushFilters needs (Spark refuses such a reader without it).
FILTER_PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"


def register(spark: Any) -> None:
    """Register the ``strom`` format with ``spark`` and turn on Python filter pushdown, so
    filters on partition, offset and timestamp narrow what a read fetches.

    First checks that Spark's Python workers (``PYSPARK_PYTHON``, else ``python3`` on PATH)
    can import strom_spark, where Spark creates the source: on a ``local`` master a
    :class:`WorkerPythonError` naming the setting to fix, elsewhere a warning (see
    :mod:`strom_spark.workers`); otherwise the first ``load()`` fails minutes later."""
    python = worker_python(spark)
    if python is not None:
        check_worker_python(python, spark.sparkContext.master)
    spark.dataSource.register(StromDataSource)
    spark.conf.set(FILTER_PUSHDOWN_CONF, "true")


__all__ = [
    "FILTER_PUSHDOWN_CONF",
    "DataLossError",
    "OptionError",
    "StromDataSource",
    "StromSparkError",
    "WorkerPythonError",
    "arrow_schema",
    "lag",
    "register",
    "spark_schema",
    "total_lag",
]
