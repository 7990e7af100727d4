"""L1 the on-disk shard cache: the cache, filling while reading, the layout on disk, eviction and
admin.
"""

from __future__ import annotations

from .admin import (
    Problem,
    clear,
    entries,
    prune,
    recover,
    usage,
    verify,
)
from .eviction import CacheLog, Room
from .fill import (
    FINISH_TAIL,
    Fill,
    FillGone,
    GrowingFile,
    TeeStream,
    wait_fills,
)
from .layout import (
    DISK_BLOCK,
    CacheLayout,
    Record,
    check_record,
    footprint,
    url_key,
)
from .shardcache import (
    CacheEntry,
    CacheUsage,
    ShardCache,
    wait_downloads,
)

__all__ = [
    "DISK_BLOCK",
    "FINISH_TAIL",
    "CacheEntry",
    "CacheLayout",
    "CacheLog",
    "CacheUsage",
    "Fill",
    "FillGone",
    "GrowingFile",
    "Problem",
    "Record",
    "Room",
    "ShardCache",
    "TeeStream",
    "check_record",
    "clear",
    "entries",
    "footprint",
    "prune",
    "recover",
    "url_key",
    "usage",
    "verify",
    "wait_downloads",
    "wait_fills",
]
