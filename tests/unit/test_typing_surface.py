"""What IDEs and type checkers see on the documented import paths (``from strom import
Producer, Consumer, Admin``, ``strom.aio``), found from outside: no ``py.typed`` (mypy
skipped strom as untyped), lazy names with no ``TYPE_CHECKING`` imports, ``aio`` constructors
taking ``(*args, **kwargs)``, and exceptions users catch only in the client modules."""

from __future__ import annotations

import ast
import inspect
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

import strom
import strom.client as strom_client
import strom.log as strom_log
import strom.record as strom_record
from strom import aio
from strom.client import admin as sync_admin
from strom.client import consumer as sync_consumer
from strom.client import producer as sync_producer

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = Path(strom.__file__).parent


@pytest.mark.parametrize(
    ("wrapper", "sync"),
    [
        (aio.Producer, sync_producer.Producer),
        (aio.Consumer, sync_consumer.Consumer),
        (aio.Admin, sync_admin.Admin),
    ],
)
def test_the_aio_constructors_have_the_sync_ones_parameters(wrapper: type, sync: type) -> None:
    sig = inspect.signature(wrapper)
    assert sig == inspect.signature(sync)
    assert "bootstrap" in sig.parameters and "args" not in sig.parameters
    with pytest.raises(TypeError, match="no_such_option"):  # checked before connecting
        wrapper("127.0.0.1:1", no_such_option=1)


def _type_checking_imports(tree: ast.Module) -> dict[str, str]:
    """name -> module of the imports under the module's ``if TYPE_CHECKING:``."""
    out: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for imp in node.body:
                assert isinstance(imp, ast.ImportFrom) and imp.module
                out.update({alias.name: imp.module for alias in imp.names})
    return out


@pytest.mark.parametrize("package", [strom, strom_client, strom_record, strom_log])
def test_the_lazy_names_are_the_type_checking_imports_and_all_resolve(package: Any) -> None:
    tree = ast.parse(Path(package.__file__).read_text())
    assert _type_checking_imports(tree) == package._LAZY
    assert sorted(package.__all__) == sorted(
        [*package._LAZY, *(["__version__"] if package is strom else [])]
    )
    for name in package.__all__:
        assert getattr(package, name) is not None
        assert name in dir(package)
    with pytest.raises(AttributeError, match="no_such_name"):
        package.no_such_name  # noqa: B018


def _loaded(code: str, modules: list[str]) -> list[list[str]]:
    """Runs ``code`` in a fresh interpreter, where each ``LOADED`` in it prints which of
    ``modules`` are imported at that point."""
    probe = f"print(*[m for m in {modules!r} if m in sys.modules], sep=',')"
    out = subprocess.run(
        [sys.executable, "-c", "import sys; " + code.replace("LOADED", probe)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.splitlines()
    return [line.split(",") if line else [] for line in out]


def test_the_client_names_are_still_loaded_on_first_use() -> None:
    """The lazy loading is there so that services never import the clients, and a
    ``strom`` command imports only what it uses (each command is a new process: importing
    pyarrow and numpy cost ~0.2 s of CPU at every one): keep it."""
    heavy = ["strom.client", "strom.client.consumer", "pyarrow", "numpy"]
    assert _loaded("import strom; LOADED; strom.Producer; LOADED", heavy) == [
        [],
        ["strom.client", "pyarrow", "numpy"],  # (the producer's batches; not the consumer)
    ]
    assert _loaded("import strom.client.admin; LOADED", heavy) == [["strom.client"]]
    assert _loaded("import strom.record.header; LOADED", heavy) == [[]]
    # The controller validates topic configs, and reads no log.
    assert _loaded("import strom.controller.service; LOADED", heavy) == [[]]
    # A node compacts, and serves Subscribe streams, only when asked to.
    later = ["pyarrow.compute", "strom.client.consumer"]
    assert _loaded("import strom.storage.node; LOADED", later) == [[]]
    # The CLI's parser (every command builds it) reads no batch.
    build = "from strom.cli.parser import build_parser; build_parser(); LOADED"
    assert _loaded(build, heavy) == [["strom.client"]]


def test_the_exceptions_users_catch_come_from_strom_and_strom_errors() -> None:
    from strom import IllegalStateError, NoOffsetForPartitionError, ProducerClosedError, errors

    assert ProducerClosedError is errors.ProducerClosedError is sync_producer.ProducerClosedError
    assert IllegalStateError is errors.IllegalStateError is sync_consumer.IllegalStateError
    assert NoOffsetForPartitionError is errors.NoOffsetForPartitionError
    assert NoOffsetForPartitionError is sync_consumer.NoOffsetForPartitionError
    for cls in (ProducerClosedError, IllegalStateError, NoOffsetForPartitionError):
        assert issubclass(cls, strom.StromError) and cls.__module__ == "strom.errors"


def test_the_package_carries_py_typed() -> None:
    assert (PACKAGE / "py.typed").is_file()
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "py.typed" in pyproject["tool"]["setuptools"]["package-data"]["strom"]


def test_the_aio_consumer_declares_what_its_getattr_hands_out() -> None:
    """Type checkers read the ``if TYPE_CHECKING:`` declarations of ``aio.Consumer``; at run
    time ``__getattr__`` serves the same names. Each public method of the sync consumer is
    either defined on the aio one or declared there, as a coroutine exactly when it is one
    of ``_BLOCKING``."""
    tree = ast.parse(Path(aio.__file__).read_text())
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Consumer"]
    (block,) = [
        n for n in cls.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING"
    ]
    awaitable, plain = set(), set()
    for stmt in block.body:
        if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Call):
            (target,) = stmt.targets
            assert isinstance(target, ast.Name)
            helper = ast.unparse(stmt.value.func)
            (awaitable if helper == "_awaitable" else plain).add(target.id)
        elif isinstance(stmt, ast.AnnAssign):
            assert isinstance(stmt.target, ast.Name)
            plain.add(stmt.target.id)
    defined = {n.name for n in cls.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
    public = {n for n in dir(sync_consumer.Consumer) if not n.startswith("_")}
    assert public - defined == awaitable | plain
    assert awaitable == aio.Consumer._BLOCKING - defined
