"""L1 the on-disk shard cache: the cache, filling while reading, following a fill, the layout on
disk, eviction and admin; and webdataset's ``webdataset.cache`` names on top of it
(``FileCache``, ``LRUCleanup``, ``cached_tarfile_to_samples``, ...: see
:mod:`wds_cloud.cache.webdataset`).
"""

from __future__ import annotations

from typing import Any

from ..handlers import reraise_exception
from ..utils import obsolete
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
from .fill import Fill, wait_fills
from .follow import FillGone, GrowingFile
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
from .tee import FINISH_TAIL, TeeStream
from .webdataset import (
    FileCache,
    LRUCleanup,
    StreamingOpen,
    cached_tarfile_samples,
    cached_tarfile_to_samples,
    cached_url_opener,
    check_tar_format,
    pipe_cleaner,
    url_to_cache_name,
)
from .webdataset_files import (
    WEBDATASET_DEFAULTS,
    download,
    get_filetype,
    islocal,
    magic_filetype,
    webdataset_default,
)

__all__ = [
    "DISK_BLOCK",
    "FINISH_TAIL",
    "CacheEntry",
    "CacheLayout",
    "CacheLog",
    "CacheUsage",
    "FileCache",
    "Fill",
    "FillGone",
    "GrowingFile",
    "LRUCleanup",
    "Problem",
    "Record",
    "Room",
    "ShardCache",
    "StreamingOpen",
    "TeeStream",
    "cached_tarfile_samples",
    "cached_tarfile_to_samples",
    "cached_url_opener",
    "check_record",
    "check_tar_format",
    "clear",
    "download",
    "entries",
    "footprint",
    "get_filetype",
    "islocal",
    "magic_filetype",
    "obsolete",
    "pipe_cleaner",
    "prune",
    "recover",
    "reraise_exception",
    "url_key",
    "url_to_cache_name",
    "usage",
    "verify",
    "wait_downloads",
    "wait_fills",
]


def __getattr__(name: str) -> Any:
    # webdataset's module defaults, computed from the environment when looked up (never at
    # import time): see wds_cloud.cache.webdataset_files
    if name in WEBDATASET_DEFAULTS:
        return webdataset_default(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(WEBDATASET_DEFAULTS))
