"""webdataset's module path ``webdataset.gopen``: ``gopen``, ``gopen_schemes``, ``rewrite_url``,
``reader`` and webdataset's command-line handlers (``Pipe``, ``gopen_curl``, ...), under that
one name.

A module of re-exports, not an alias: ``gopen`` and its scheme table are the router's
(:mod:`wds_cloud.router`), the handlers live in :mod:`wds_cloud.io.commands`. ``gopen_schemes``
is a live view of the opener registry, so ``gopen_schemes["foo"] = handler`` (webdataset's way
to add a scheme, ``handler(url, mode, bufsize, **kw)``) makes ``gopen("foo://...")`` and the
datasets open ``foo:`` URLs with it.

As in webdataset, the package attribute ``wds_cloud.gopen`` is the function, which shadows this
module: ``import wds_cloud.gopen`` and ``from wds_cloud.gopen import gopen_schemes`` work, and
``wds_cloud.gopen(url)`` still calls the function.
"""

from .io.commands import (
    Pipe,
    gopen_ais,
    gopen_curl,
    gopen_error,
    gopen_file,
    gopen_gsutil,
    gopen_hf,
    gopen_htgs,
    gopen_pipe,
    info,
    set_options,
)
from .router import gopen, gopen_schemes, reader, rewrite_url

__all__ = [
    "Pipe",
    "gopen",
    "gopen_ais",
    "gopen_curl",
    "gopen_error",
    "gopen_file",
    "gopen_gsutil",
    "gopen_hf",
    "gopen_htgs",
    "gopen_pipe",
    "gopen_schemes",
    "info",
    "reader",
    "rewrite_url",
    "set_options",
]
