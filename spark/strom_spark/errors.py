"""What the connector reports to Spark users.

Spark shows a data source's exception as the last line of a Python traceback wrapped in its
own error (``[PYTHON_DATA_SOURCE_ERROR] Failed to ...``). So every problem a user can cause or
fix (an option, a topic name, an unreachable cluster, lost data) is raised on the driver,
while the query is planned, as one of these exceptions with a message that names what was
wrong; :func:`user_facing` trims the traceback to the one frame that raised it. Problems found
in an executor task (a partition losing its data mid-read) use the same classes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from strom.errors import StromError

F = TypeVar("F", bound=Callable[..., Any])


class StromSparkError(Exception):
    """A problem with a strom read or write in Spark, in words a user can act on."""


class OptionError(StromSparkError, ValueError):
    """An option is missing, unknown, or has a value that does not parse."""


class DataLossError(StromSparkError):
    """Records the query needs are gone (retention, a deleted partition) and
    ``failOnDataLoss`` is true."""


class ClusterUnavailableError(StromSparkError):
    """No strom node answered at the bootstrap addresses."""


def user_facing(fn: F) -> F:
    """Re-raise the connector's and the client's errors without the frames below ``fn``.

    Spark prints a planner worker's whole traceback before the message; for an error the user
    caused, the frames inside the connector are noise. Anything else (a bug) keeps its full
    traceback.
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (StromSparkError, StromError) as exc:
            if isinstance(exc, StromError) and not isinstance(exc, StromSparkError):
                err: Exception = StromSparkError(f"strom: {exc}")
            else:
                err = exc
            raise err.with_traceback(None) from None

    return wrapper  # type: ignore[return-value]
