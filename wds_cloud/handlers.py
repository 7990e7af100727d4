"""Exception handlers, with webdataset's names and return protocol.

A stage that catches an exception ``exn`` calls ``handler(exn)``; the handler either raises,
returns ``True`` (skip the item and go on) or ``False`` (stop the stage quietly). Unlike
webdataset, the warning handlers do not sleep.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

__all__ = [
    "Handler",
    "ignore_and_continue",
    "ignore_and_stop",
    "reraise_exception",
    "warn_and_continue",
    "warn_and_stop",
]

Handler = Callable[[BaseException], bool]


def reraise_exception(exn: BaseException) -> bool:
    """Raise ``exn`` again."""
    raise exn


def ignore_and_continue(exn: BaseException) -> bool:
    """Drop the failing item and go on."""
    return True


def warn_and_continue(exn: BaseException) -> bool:
    """Warn (``warnings.warn``), drop the failing item and go on."""
    warnings.warn(repr(exn), stacklevel=2)
    return True


def ignore_and_stop(exn: BaseException) -> bool:
    """Stop the stage quietly."""
    return False


def warn_and_stop(exn: BaseException) -> bool:
    """Warn, then stop the stage."""
    warnings.warn(repr(exn), stacklevel=2)
    return False
