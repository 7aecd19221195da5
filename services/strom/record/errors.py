"""The one exception the record engine raises for bad batch bytes.

Brokers map it to ``CORRUPT_MESSAGE`` (or ``MESSAGE_TOO_LARGE`` when ``too_large`` is set);
clients surface it as is. It always names what was wrong and where, so an operator reading a
log line can find the byte that broke.
"""

from __future__ import annotations


class InvalidBatchError(ValueError):
    """Raised for corrupt, truncated, oversized or otherwise malformed record batches.

    Attributes:
        position: byte offset of the offending batch within the buffer that was parsed.
        too_large: True when the batch is well formed but exceeds the allowed size (its
            bytes, or its body decompressed): a reader then says "too large for this
            reader", not "corrupt".
        limit: the size it exceeded (0 when not ``too_large``).
        next_offset: the offset after the batch when known (-1 otherwise), so that a reader
            can say where to seek to skip it.
    """

    def __init__(
        self,
        message: str,
        *,
        position: int = 0,
        too_large: bool = False,
        limit: int = 0,
        next_offset: int = -1,
    ) -> None:
        super().__init__(message)
        self.position = position
        self.too_large = too_large
        self.limit = limit
        self.next_offset = next_offset
