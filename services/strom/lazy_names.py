"""Package names loaded on first use (PEP 562), for :mod:`strom`, :mod:`strom.client`,
:mod:`strom.record` and :mod:`strom.log`.

Why: every service and every ``strom`` command is a new process, and importing a package's
every module (the client's consumer, the batch codec's pyarrow and numpy, the log engine) cost
each one tenths of a second of CPU it mostly did not need (docs/benchmarks.md, "what a service
start imports"). A package lists ``name -> module`` and keeps ``TYPE_CHECKING`` imports of the
same names for type checkers (tests/unit/test_typing_surface.py keeps the two in step).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_names(
    package: str, names: Mapping[str, str], namespace: Mapping[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package`` (whose globals are ``namespace``)
    that load each of ``names`` from its module when first asked for."""

    def __getattr__(name: str) -> Any:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module), name)

    def __dir__() -> list[str]:
        # The lazy names too, for completion in a REPL or notebook.
        return sorted({*namespace, *names})

    return __getattr__, __dir__
