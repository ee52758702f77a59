"""The retry policy of the I/O-bound tasks: ``io_task`` retries transport errors only.

A task that reads or writes the store or a dump server may meet a dropped
connection or a store that is down for a moment; the next attempt may succeed.
Bad input and programming errors fail the same way every time, so they are
never retried.
"""

from __future__ import annotations

import errno
from typing import Any

from prefect import task

from rag_core.errors import WikiragError
from rag_core.storage import StoreUnreachableError

# A request that failed on the way: the store or the dump server may answer the next one. Names, not classes:
# botocore's and aiohttp's connection errors share no base with the standard library's.
_TRANSPORT_ERRNOS = frozenset({errno.ECONNRESET, errno.ECONNREFUSED, errno.ECONNABORTED, errno.ETIMEDOUT,
                               errno.EHOSTUNREACH, errno.ENETUNREACH, errno.ENETDOWN, errno.EPIPE})
_TRANSPORT_CLASSES = frozenset({"ConnectionError", "TimeoutError", "ClientConnectionError", "ReadTimeoutError",
                                "ConnectTimeoutError", "ServerTimeoutError"})


def retry_unless_bad_input(task: Any, task_run: Any, state: Any) -> bool:
    """Retry transport errors only (store unreachable or 5xx, a dropped connection, a timeout): bad input stays bad
    and a programming error (TypeError, KeyError, ...) fails the same way every time."""
    try:
        state.result()
    except StoreUnreachableError:
        return True
    except WikiragError:
        return False
    except Exception as exc:
        if isinstance(exc, OSError) and exc.errno in _TRANSPORT_ERRNOS:
            return True
        return any(cls.__name__ in _TRANSPORT_CLASSES for cls in type(exc).__mro__)
    return True


io_task = task(retries=2, retry_delay_seconds=2, retry_condition_fn=retry_unless_bad_input)
