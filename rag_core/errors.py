"""Exceptions that carry a message a user can act on: the input and the fix."""


class WikiragError(Exception):
    """Base class; the CLI prints the message of any subclass as one line."""


class DumpError(WikiragError):
    """The dump (or its multistream index) cannot be read as a MediaWiki export."""


class StoreError(WikiragError):
    """The store cannot be reached, is not authorised, or holds something unexpected."""


class GateError(WikiragError):
    """A data-quality gate failed; nothing was published."""
