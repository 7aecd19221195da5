"""Spark's Python workers must be able to import strom_spark: ``register(spark)`` checks the
interpreter they run, and the README's Spark block, run as a newcomer runs it, works.

Found from outside: the README's block run as ``.venv/bin/python script.py`` (no virtualenv
activated) failed at its first ``load()`` after ~3 minutes with ``ModuleNotFoundError: No
module named 'strom_spark'`` inside ~40 lines of Py4J traceback: the workers ran ``python3``
from PATH, the system's.
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from strom_spark import WorkerPythonError
from strom_spark.workers import check_worker_python, import_problem, is_local_master
from tests.spark.conftest import create_topic

PROC = Path(__file__).with_name("readme_spark_proc.py")


def bare_python(directory: Path, name: str = "python3") -> Path:
    """A real interpreter without site-packages (``-S``): like a system Python, it has
    neither strom_spark nor its dependencies."""
    path = directory / name
    path.write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
    path.chmod(0o755)
    return path


def test_local_masters_are_told_from_cluster_ones() -> None:
    for master in ("local", "local[2]", "local[*]", "local[2,4]", "local-cluster[2,1,1024]"):
        assert is_local_master(master), master
    for master in ("spark://h:7077", "yarn", "k8s://https://h:443", "localhost"):
        assert not is_local_master(master), master


def test_this_interpreter_can_import_the_connector() -> None:
    assert import_problem(sys.executable) is None


def test_a_local_master_whose_workers_cannot_import_it_is_refused(tmp_path: Path) -> None:
    python = bare_python(tmp_path)
    with pytest.raises(WorkerPythonError) as err:
        check_worker_python(str(python), "local[2]")
    message = str(err.value)
    assert "\n" not in message
    assert str(python) in message and "cannot import strom_spark" in message
    assert "PYSPARK_PYTHON" in message and sys.executable in message


def test_a_missing_interpreter_is_named() -> None:
    with pytest.raises(WorkerPythonError, match=r"'no-such-python3' .*not found on PATH"):
        check_worker_python("no-such-python3", "local[1]")


def test_a_cluster_master_only_warns(tmp_path: Path) -> None:
    """Executors elsewhere may have their own environment: not this machine's to judge."""
    python = bare_python(tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_worker_python(str(python), "spark://spark-master:7077")
    (warning,) = caught
    assert "cannot import strom_spark" in str(warning.message)
    assert "environment of their own" in str(warning.message)


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_readme_spark_block_runs_as_a_newcomer_runs_it(bootstrap: str, tmp_path: Path) -> None:
    """``python script.py``, no virtualenv on PATH, no PYSPARK_PYTHON: ``python3`` on PATH is
    one without strom_spark. register() refuses such a session in one line, and the README's
    block (which points PYSPARK_PYTHON at its own interpreter) runs to its end."""
    prefix = "readme-spark"
    create_topic(bootstrap, prefix, 6)
    create_topic(bootstrap, f"{prefix}-upper", 6)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    bare_python(bin_dir)
    venv_bin = os.path.dirname(sys.executable)
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p != venv_bin]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK_")}
    env["PATH"] = os.pathsep.join([str(bin_dir), *path])
    argv = [sys.executable, str(PROC), bootstrap, prefix, str(tmp_path / "checkpoint")]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=840)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    refused = [line for line in done.stdout.splitlines() if line.startswith("REFUSED ")]
    assert len(refused) == 1, done.stdout
    assert f"{bin_dir / 'python3'}" in refused[0] and "PYSPARK_PYTHON" in refused[0]
    assert "README BLOCK DONE" in done.stdout
    assert "Traceback" not in done.stderr
