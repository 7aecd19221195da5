"""Writing a server stream's messages to a caller that may have gone.

A caller that cancels a stream (a Subscribe reader that stops, a consumer or follower closing
its FetchStream) makes the handler's next write fail in gRPC core (``ExecuteBatchError``).
grpc.aio logs that failure at ERROR with a traceback ("ExecuteBatchError raised in core by servicer
method") unless its own notice of the cancellation was handled first, a race the write usually wins,
so every mid-stream cancel would leave an ERROR in the log. Streams that outlive their callers write
through :func:`write` (or are served by :func:`writes_answers`): a failed write ends the handler as
a cancellation, which grpc.aio logs at DEBUG, and the handler's ``finally`` blocks run as usual.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from grpc._cython.cygrpc import ExecuteBatchError

log = logging.getLogger("strom.service.stream_writes")


async def write(context: Any, message: Any) -> None:
    """``context.write(message)``; raises CancelledError when the call is gone (the caller
    cancelled it, or its deadline passed): nothing more can be sent on it."""
    try:
        await context.write(message)
    except ExecuteBatchError as exc:
        log.debug("stream write failed, the caller is gone: %s", exc)
        raise asyncio.CancelledError("the caller ended the stream") from None


def writes_answers(
    handler: Callable[[Any, Any], AsyncIterator[Any]],
) -> Callable[[Any, Any], Awaitable[None]]:
    """A stream handler that is an async generator, as one that writes each answer with
    :func:`write` (grpc.aio's own loop over a generator gives no way to see the failed
    write). The generator is closed when the stream ends, however it ends."""

    async def serve(request: Any, context: Any) -> None:
        async with contextlib.aclosing(handler(request, context)) as answers:
            async for answer in answers:
                await write(context, answer)

    return serve
