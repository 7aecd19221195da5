"""The log cleaner is split by what each module holds (strom.log.cleaner, cleaner_selection,
cleaner_scan, cleaner_rewrite, cleaner_swap); what others see must not follow the split: the
names they import from ``strom.log.cleaner`` and ``strom.log``, and the logger name operators
filter the cleaner's errors on."""

from __future__ import annotations

from strom import log
from strom.log import cleaner, cleaner_selection, cleaner_swap


def test_the_public_names_still_import_from_the_cleaner_module() -> None:
    for name in cleaner.__all__:
        assert getattr(cleaner, name) is getattr(log, name)
    for name in ("CleanableRange", "CleanerStats", "cleanable_range", "select_logs"):
        assert getattr(cleaner, name) is getattr(cleaner_selection, name)
    assert cleaner.compact.__module__ == "strom.log.cleaner"


def test_the_swap_logs_under_the_cleaners_logger() -> None:
    """Operators filter on "strom.log.cleaner": the swap's error about a compacted segment
    cut on reopening keeps that name though it comes from strom.log.cleaner_swap."""
    assert cleaner_swap._log.name == "strom.log.cleaner"
