"""L1 bricks: the opener registry, local files and stdio, ``pipe:`` commands, streams and read-
ahead.
"""

from __future__ import annotations

from .local import LocalOpener, StdioOpener
from .pace import Pace
from .pipes import PipeOpener
from .prefetched import PrefetchedStream, prefetched_stream
from .readahead import ReadAhead, ReadAheadStats
from .registry import (
    Opener,
    function_opener,
    get_opener,
    register_opener,
    registered_schemes,
    unregister_opener,
)
from .streams import SequentialStream

__all__ = [
    "LocalOpener",
    "Opener",
    "Pace",
    "PipeOpener",
    "PrefetchedStream",
    "ReadAhead",
    "ReadAheadStats",
    "SequentialStream",
    "StdioOpener",
    "function_opener",
    "get_opener",
    "prefetched_stream",
    "register_opener",
    "registered_schemes",
    "unregister_opener",
]
