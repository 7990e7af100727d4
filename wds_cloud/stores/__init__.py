"""L1 remote stores on fsspec: one module per store, their shared base, and the retry room.

``s3.py``, ``gcs.py``, ``azure.py`` and ``http.py`` are the openers (AIStore goes through
``http.py``); ``base.py`` is what the fsspec-backed ones share; ``streams.py`` the resumable
read stream and the atomic upload; ``aio.py`` the bridge to fsspec's event loop (and the fork
hooks that keep forked workers off the parent's connections); ``direct.py`` the GETs that
``s3://``, ``gs://`` and ``http(s)://`` send and receive on the reading thread instead. ``retry.py``
holds every retry decision: the policy, what is transient for each store, the one attempt
loop that reads, resumes and uploads use, and how a failure is put in words
(:func:`reason`); ``iostats.py`` the per-process :func:`io_stats` counters.

Nothing here imports fsspec or a cloud SDK until a URL of its scheme is opened.
"""

from __future__ import annotations

from .aio import AsyncBody, guard_forks, run
from .azure import AzureOpener
from .base import (
    CloudOpener,
    Fetched,
    LoopSource,
    Request,
    header_meta,
    library_error,
    object_size,
    parameters,
    range_ignored,
    releaser,
    send_parts,
    sequential_parts,
)
from .gcs import GcsOpener
from .http import HttpOpener
from .retry import (
    IO_FIELDS,
    TRANSIENT,
    TRANSIENT_BY_STORE,
    IOStats,
    Retrier,
    RetryableError,
    RetryPolicy,
    count_io,
    describe,
    io_stats,
    is_transient,
    reason,
    report_io_to,
    reset_io_stats,
    status_error,
    transient_errors,
)
from .s3 import S3Opener
from .streams import (
    AtomicUpload,
    Body,
    ObjectMeta,
    RangeSource,
    ResumableStream,
    opener_options,
)

__all__ = [
    "IO_FIELDS",
    "TRANSIENT",
    "TRANSIENT_BY_STORE",
    "AsyncBody",
    "AtomicUpload",
    "AzureOpener",
    "Body",
    "CloudOpener",
    "Fetched",
    "GcsOpener",
    "HttpOpener",
    "IOStats",
    "LoopSource",
    "ObjectMeta",
    "RangeSource",
    "Request",
    "ResumableStream",
    "Retrier",
    "RetryPolicy",
    "RetryableError",
    "S3Opener",
    "count_io",
    "describe",
    "guard_forks",
    "header_meta",
    "io_stats",
    "is_transient",
    "library_error",
    "object_size",
    "opener_options",
    "parameters",
    "range_ignored",
    "reason",
    "releaser",
    "report_io_to",
    "reset_io_stats",
    "run",
    "send_parts",
    "sequential_parts",
    "status_error",
    "transient_errors",
]
