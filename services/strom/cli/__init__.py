"""The ``strom`` command line."""


def counted(n: int, noun: str) -> str:
    """``1 partition``, ``3 partitions``: what the CLI prints, in English."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
