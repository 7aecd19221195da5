"""The README's Spark block, run as a newcomer runs it: ``python script.py`` with no
virtualenv activated and no ``PYSPARK_PYTHON`` (the test starts this process so).

First the session the block would get without its ``PYSPARK_PYTHON`` line (``python3`` from
PATH in the workers): ``register`` must refuse it in one line. Then the block itself, taken
from README.md at run time with only the address, topic names and checkpoint replaced; it
must run to its end. Usage: readme_spark_proc.py BOOTSTRAP TOPIC_PREFIX CHECKPOINT_DIR
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_spark_block() -> str:
    """The README's Spark block (the one that calls ``register(spark)``)."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    (block,) = [b for b in blocks if "register(spark)" in b]
    return block


def _replace(code: str, old: str, new: str) -> str:
    if old not in code:
        raise SystemExit(f"the README's Spark block changed: {old!r} is not in it any more")
    return code.replace(old, new)


def refused_without_pyspark_python() -> str:
    """``register`` on a session whose workers run ``python3`` from PATH: the one-line error."""
    from pyspark.sql import SparkSession

    from strom_spark import WorkerPythonError, register

    spark = SparkSession.builder.master("local[1]").getOrCreate()
    try:
        register(spark)
    except WorkerPythonError as exc:
        return str(exc)
    finally:
        spark.stop()
    raise SystemExit("register(spark) accepted workers that cannot import strom_spark")


def main() -> None:
    bootstrap, prefix, checkpoint = sys.argv[1:4]
    print("REFUSED", refused_without_pyspark_python(), flush=True)
    code = readme_spark_block()
    code = _replace(code, '"127.0.0.1:9092"', repr(bootstrap))
    code = _replace(code, '"clicks-upper"', repr(f"{prefix}-upper"))
    code = _replace(code, '"clicks"', repr(prefix))
    code = _replace(code, '"/tmp/clicks-upper"', repr(checkpoint))
    exec(compile(code, "README.md (Spark)", "exec"), {"__name__": "__readme__"})
    print("README BLOCK DONE", flush=True)


if __name__ == "__main__":
    main()
