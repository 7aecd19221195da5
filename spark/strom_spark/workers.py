"""Whether Spark's Python workers can import ``strom_spark``, checked when it is registered.

Spark creates a Python data source in a Python worker process, not in the driver's
interpreter: the one named by ``PYSPARK_PYTHON`` when the SparkContext was created, else
``python3`` from PATH (``SparkContext.pythonExec``; PySpark 4 reads nothing else for a session
built in a script, ``spark.pyspark.python`` included). A script run as ``.venv/bin/python
script.py`` without the virtualenv activated gets the system's ``python3`` there, and the first
``load()`` failed minutes later with ``ModuleNotFoundError: No module named 'strom_spark'``
inside a long Py4J traceback. :func:`check_worker_python` says so at
``register(spark)``, in one line naming the setting to fix.

On a ``local`` master the workers run on this machine, so the check is certain and a failure
raises :class:`WorkerPythonError`. On a real cluster the executors may have an environment of
their own (a packed virtualenv, an image) that this machine cannot see: there it only warns.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
import warnings
from typing import Any

from strom_spark.errors import StromSparkError

#: Masters whose executors run on this machine: ``local``, ``local[4]``, ``local[2,3]``,
#: ``local[*]``, ``local-cluster[2,1,1024]``.
_LOCAL_MASTER = re.compile(r"^local(\[.*\]|-cluster\[.*\])?$")
#: How long importing strom_spark in the workers' Python may take (a loaded machine).
_IMPORT_TIMEOUT_S = 120.0


class WorkerPythonError(StromSparkError):
    """Spark's Python workers would run an interpreter that cannot import strom_spark."""


def worker_python(spark: Any) -> str | None:
    """The interpreter Spark's Python workers run for ``spark``, as PySpark passes it with
    every Python function (``SparkContext.pythonExec``); None for a Spark Connect session,
    whose workers run on the server."""
    try:
        return str(spark.sparkContext.pythonExec)
    except Exception:  # Spark Connect has no SparkContext
        return None


def is_local_master(master: str) -> bool:
    """Whether a Spark master URL runs its executors on this machine."""
    return bool(_LOCAL_MASTER.match(master.strip()))


def import_problem(python: str) -> str | None:
    """Why ``python`` cannot import strom_spark as a Spark worker would (PySpark's own zips
    on its path, as Spark puts them there), or None when it can."""
    path = python if os.sep in python else shutil.which(python)
    if path is None:
        return "not found on PATH"
    if os.path.abspath(path) == os.path.abspath(sys.executable):
        return None  # this interpreter: it imported strom_spark already
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*_pyspark_zips(), *filter(None, [env.get("PYTHONPATH")])])
    try:
        done = subprocess.run(
            [path, "-c", "import strom_spark"],
            env=env,
            capture_output=True,
            text=True,
            timeout=_IMPORT_TIMEOUT_S,
        )
    except OSError as exc:
        return f"cannot run: {exc.strerror or exc}"
    except subprocess.TimeoutExpired:
        return None  # slow, not broken: let Spark find out
    if done.returncode == 0:
        return None
    lines = done.stderr.strip().splitlines()
    return lines[-1] if lines else f"exit status {done.returncode}"


def _pyspark_zips() -> list[str]:
    """The pyspark and py4j zips Spark adds to its workers' PYTHONPATH."""
    try:
        import pyspark
    except ImportError:
        return []
    return sorted(glob.glob(os.path.join(os.path.dirname(pyspark.__file__), "python/lib/*.zip")))


def check_worker_python(python: str, master: str) -> None:
    """Raise :class:`WorkerPythonError` (a local master) or warn (any other) when ``python``,
    the workers' interpreter, cannot import strom_spark."""
    problem = import_problem(python)
    if problem is None:
        return
    found = shutil.which(python) if os.sep not in python else None
    shown = f"{python!r} ({found})" if found else repr(python)
    message = (
        f"Spark's Python workers run {shown} (PYSPARK_PYTHON, else python3 on PATH), which "
        f"cannot import strom_spark ({problem}): set os.environ['PYSPARK_PYTHON'] to a Python "
        f"with strom[spark] installed (this one: {sys.executable}) before the SparkSession "
        "is created"
    )
    if is_local_master(master):
        raise WorkerPythonError(message)
    warnings.warn(
        f"{message} (ignore this if the executors have an environment of their own)",
        RuntimeWarning,
        stacklevel=3,
    )
