"""`strom demo`'s Ctrl-C once Spark is up (strom_spark.demo._Interrupt), against a fake session:
what the handler does must also reach the Spark jobs and queries the demo starts after the
signal, not only those running at that moment.

Found under load (the ctrl-c test of test_cli.py): the SIGINT came as the batch read was about
to start its job; the handler cancelled nothing (no job yet), and the batch read and the
top-pages query ran for four more minutes before the streaming loop noticed the signal."""

from __future__ import annotations

import signal
import threading
from types import SimpleNamespace

import pytest

from strom.devcluster.procs import wait_for
from strom_spark.demo import _Interrupt


class FakeSpark:
    """The parts of a SparkSession the handler touches: the active streaming queries and
    ``sparkContext.cancelAllJobs()``. A job or query runs until it is cancelled or stopped."""

    def __init__(self) -> None:
        self.sparkContext = self
        self.streams = SimpleNamespace(active=[])
        self._jobs: list[threading.Event] = []
        self._lock = threading.Lock()

    def start_job(self) -> threading.Event:
        """A job the demo's main thread starts; set once it is cancelled."""
        cancelled = threading.Event()
        with self._lock:
            self._jobs.append(cancelled)
        return cancelled

    def start_query(self) -> threading.Event:
        """A streaming query; set once it is stopped."""
        stopped = threading.Event()
        self.streams.active = [*self.streams.active, SimpleNamespace(stop=stopped.set)]
        return stopped

    def cancelAllJobs(self) -> None:  # PySpark's name
        with self._lock:
            jobs, self._jobs = self._jobs, []
        for job in jobs:
            job.set()


def test_a_ctrl_c_between_two_spark_steps_stops_the_next_one() -> None:
    spark = FakeSpark()
    interrupt = _Interrupt()
    interrupt.spark = spark
    try:
        interrupt.handle(signal.SIGINT, None)  # between two steps: nothing runs yet
        job = spark.start_job()  # the main thread's next step
        wait_for(job.is_set, timeout=30, what="the job started after the Ctrl-C cancelled")
        query = spark.start_query()
        wait_for(query.is_set, timeout=30, what="the query started after the Ctrl-C stopped")
        with pytest.raises(KeyboardInterrupt):
            interrupt.check()
    finally:
        interrupt.close()
    assert not [t for t in threading.enumerate() if t.name == "demo-interrupt"]


def test_a_second_ctrl_c_does_not_start_another_canceller() -> None:
    """The clean-up after the first must not be cut short or doubled."""
    spark = FakeSpark()
    interrupt = _Interrupt()
    interrupt.spark = spark
    try:
        interrupt.handle(signal.SIGINT, None)
        interrupt.handle(signal.SIGINT, None)
        assert len([t for t in threading.enumerate() if t.name == "demo-interrupt"]) == 1
    finally:
        interrupt.close()
    assert interrupt.describe() == "Ctrl-C"
