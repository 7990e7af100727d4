"""Real object-store servers for tests and benchmarks, each bound to 127.0.0.1 on a free port.

Servers (plain context managers, usable without pytest, e.g. from tests/bench/):
:class:`S3Server` (rclone), :class:`GcsServer` (fake-gcs-server), :class:`AzuriteServer`,
:class:`NginxServer`, :class:`AisServer` (our AIStore-REST server) and :class:`FaultProxy`.
Each has ``new_store()`` (AisServer: ``gs_store()``/``native_store()``) returning a
:class:`Store` on a fresh bucket. Their life cycle (start once, stop, own temp dir, context
manager) is :class:`stores.procs.ManagedServer`; the fsspec-backed ones (S3, GCS, Azure) are
:class:`stores.base.FsspecServer`. The pytest fixtures are in :mod:`stores.fixtures`. Scripts call
:func:`isolate_env` first (before gcsfs is imported): no cloud-metadata probing.
"""

from .ais import AisGsStore, AisNativeStore, AisServer
from .azure import AzureStore, AzuriteServer
from .base import DENY_MARK, DENY_PATTERN, LocalStore, Store
from .gcs import GcsServer, GcsStore
from .nginx import AccessLogEntry, HttpStore, NginxServer
from .procs import NO_METADATA_ENV, ServerStartError, default_sigint, isolate_env
from .proxy import FaultProxy, ProxiedRequest
from .s3 import S3Server, S3Store

__all__ = [
    "DENY_MARK",
    "DENY_PATTERN",
    "NO_METADATA_ENV",
    "AccessLogEntry",
    "AisGsStore",
    "AisNativeStore",
    "AisServer",
    "AzureStore",
    "AzuriteServer",
    "FaultProxy",
    "GcsServer",
    "GcsStore",
    "HttpStore",
    "LocalStore",
    "NginxServer",
    "ProxiedRequest",
    "S3Server",
    "S3Store",
    "ServerStartError",
    "Store",
    "default_sigint",
    "isolate_env",
]
