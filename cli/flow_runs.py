"""How a command runs a flow: its module imported while the Prefect server boots, and the tracebacks of
expected failures (bad input, a stop) kept off the console, where one line explains them."""

from __future__ import annotations

import importlib
import logging
import typing

from rag_core.errors import WikiragError
from runtime import stop_signals


def import_flow(module: str) -> typing.Callable[[], None]:
    """A ``meanwhile`` for ``prefect_api`` that imports a flow's module (Prefect, Dask and the tasks: 2-3 s on
    2 cores) while the server boots; ``prefect_api`` exports the API URL first, so Prefect reads the right one."""
    def load() -> None:
        importlib.import_module(module)

    return load


class _ExpectedErrorFilter(logging.Filter):
    """Bad input, or a stop, is explained by one line; its traceback would only bury that line."""

    def filter(self, record: logging.LogRecord) -> bool:
        # After a stop signal, a failure is its consequence: the one line main() prints says so.
        if record.exc_info and (isinstance(record.exc_info[1], WikiragError) or stop_signals.received()):
            record.exc_info = None
            record.exc_text = None
        return True


def quiet_expected_tracebacks() -> None:
    from prefect.logging.handlers import PrefectConsoleHandler

    loggers = [logging.root, *(logging.getLogger(n) for n in list(logging.root.manager.loggerDict))]
    for logger in loggers:
        for handler in getattr(logger, "handlers", []):
            if isinstance(handler, PrefectConsoleHandler):
                handler.addFilter(_ExpectedErrorFilter())
