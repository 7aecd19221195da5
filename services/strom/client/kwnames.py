"""Clear errors for keyword arguments the clients do not take, Kafka's names first of all.

Habits from kafka-python and confluent-kafka are meant to carry over (DESIGN §1), and where
a name differs (``compression_type``, ``NewTopic(num_partitions=...)``) a bare "unexpected
keyword argument" leaves users guessing. :func:`kafka_keywords` wraps a constructor: a Kafka
name gets strom's name in the error, a typo gets a "did you mean", and ``bootstrap_servers``
(kafka-python's name) is taken as ``bootstrap``. The check costs the constructor a dict
lookup per keyword, and nothing after.
"""

from __future__ import annotations

import difflib
import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

from strom.argtypes import INT32_MAX, INT64_MAX, LONG_MS_MAX

__all__ = [
    "INT32_MAX",
    "INT64_MAX",
    "INT64_MIN",
    "INT_MS_MAX",
    "LONG_MS_MAX",
    "bool_option",
    "int_option",
    "kafka_keywords",
    "str_option",
    "wait_limit",
]

F = TypeVar("F", bound=Callable[..., Any])

#: kafka-python / confluent-kafka keyword -> strom's name for the same setting.
KAFKA_NAMES = {
    "compression_type": "compression",
    "max_in_flight_requests_per_connection": "max_in_flight",
    "num_partitions": "partitions",
    "replica_assignments": "replica_assignment",
    "topic_configs": "config",
    "configs": "config",
    "topic": "name",
}


def kafka_keywords(init: F) -> F:
    """Wrap ``init`` (a constructor) with the checks described in the module docstring."""
    params = inspect.signature(init).parameters
    names = [n for n, p in params.items() if n != "self" and p.kind is not p.VAR_KEYWORD]
    known = frozenset(names)
    takes_bootstrap = "bootstrap" in known
    what = init.__qualname__.split(".")[0]

    @functools.wraps(init)
    def checked(self: Any, *args: Any, **kwargs: Any) -> Any:
        if takes_bootstrap and "bootstrap_servers" in kwargs:
            servers = kwargs.pop("bootstrap_servers")
            if args or "bootstrap" in kwargs:
                given = args[0] if args else kwargs["bootstrap"]
                raise TypeError(
                    f"{what}() got the bootstrap servers twice: {given!r} and "
                    f"bootstrap_servers={servers!r}"
                    + (
                        " (the first argument is the bootstrap servers; topics go to "
                        "subscribe() or assign())"
                        if what == "Consumer"
                        else ""
                    )
                )
            kwargs["bootstrap"] = servers
        for key in kwargs:
            if key not in known:
                raise TypeError(_unknown(what, key, names))
        return init(self, *args, **kwargs)

    return checked  # type: ignore[return-value]


def _unknown(what: str, key: str, names: list[str]) -> str:
    message = f"{what}() got an unexpected keyword argument {key!r}"
    strom_name = KAFKA_NAMES.get(key)
    if strom_name in names:
        return f"{message}: strom calls it {strom_name!r}"
    close = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
    if close:
        return f"{message}: did you mean {close[0]!r}?"
    return message


def bool_option(name: str, value: Any) -> bool:
    """A boolean setting, strictly: ``True``/``False``, or the strings ``"true"``/``"false"``
    in any case, as Kafka's config parser takes them (settings read from the environment or a
    file arrive as strings). Anything else is refused naming the setting, since
    ``bool("false")`` is True."""
    if value is True or value is False:
        return value
    if isinstance(value, str):
        lowered = value.strip().lower()
        if lowered in ("true", "false"):
            return lowered == "true"
        raise ValueError(f"{name} must be true or false, got {value!r}")
    raise TypeError(f"{name} must be a bool (or 'true'/'false'), got {type(value).__name__}")


#: The smallest protobuf int64.
INT64_MIN = -(2**63)
#: Settings in ms that Kafka types as ``int`` (request.timeout.ms, delivery.timeout.ms,
#: fetch.max.wait.ms ...) and that strom sends as int32 fields: Kafka's maximum, ~24.8 days.
INT_MS_MAX = INT32_MAX

#: What the usual maxima are, for the message.
_WHY = {
    INT32_MAX: " (2**31-1: an int32, as Kafka's)",
    INT64_MAX: " (2**63-1: an int64)",
    LONG_MS_MAX: " (2**40 ms, ~34 years: longer waits overflow the clock's timeouts)",
}


def int_option(name: str, value: Any, minimum: int, maximum: int, why: str = "") -> int:
    """``value`` if it is an int (not a bool) within ``[minimum, maximum]``; else TypeError or
    ValueError naming ``name`` and the range (``why`` says where the maximum comes from).

    The one check of the clients' numeric settings and of the method arguments that go on
    the wire: a value the wire cannot carry fails here, naming the argument, not inside
    protobuf or on a background thread."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if not minimum <= value <= maximum:
        why = why or _WHY.get(maximum, "")
        raise ValueError(f"{name} must be >= {minimum} and <= {maximum}{why}, got {value}")
    return value


def str_option(name: str, value: Any, *, empty_ok: bool = False) -> str | None:
    """``value`` if it is None or a str (non-empty unless ``empty_ok``); else TypeError or
    ValueError naming ``name``, before a background thread puts it on the wire."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str or None, got {value!r}")
    if not value and not empty_ok:
        raise ValueError(f"{name} must not be empty (leave it out instead)")
    return value


#: The longest wait in seconds a call's timeout may mean; longer is no limit (None).
MAX_WAIT_S = LONG_MS_MAX / 1000


def wait_limit(name: str, timeout: Any, *, ms: bool = False) -> float | None:
    """A call's ``timeout`` (in seconds, or in ms with ``ms``) as seconds for ``threading``'s
    waits: None (no limit) for None, infinity and anything past LONG_MS_MAX, since longer
    waits overflow there and Kafka's clients wait as asked; TypeError naming ``name`` for
    what is not a number."""
    unit = "ms" if ms else "seconds"
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout != timeout:
        raise TypeError(f"{name} must be a number of {unit} or None, got {timeout!r}")
    if timeout > (LONG_MS_MAX if ms else MAX_WAIT_S):
        return None
    return timeout / 1000 if ms else timeout
