"""webdataset's ``webdataset.cache`` helpers for files, with webdataset 1.0.2's names and
behaviour: ``islocal``, ``magic_filetype``, ``get_filetype`` and ``download``; and its module
defaults ``default_cache_dir``, ``default_cache_size`` and ``verbose_cache``.

webdataset set the defaults from ``WDS_CACHE``, ``WDS_CACHE_SIZE`` and ``WDS_VERBOSE_CACHE``
when it was imported; nothing is read at import time here, so each is computed from the
environment (through :class:`~wds_cloud.settings.Settings`) when it is looked up
(:func:`webdataset_default`). As in webdataset, setting ``wds.cache.default_cache_dir`` changes
the directory of a :class:`~wds_cloud.cache.FileCache` made without one (the only one of the
three webdataset's code read).
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any
from urllib.parse import urlparse

from ..settings import Settings

__all__ = ["WEBDATASET_DEFAULTS", "default_cache_dir_of", "download", "get_filetype", "islocal",
           "magic_filetype", "webdataset_default"]

#: the module defaults of webdataset's ``cache`` (see :func:`webdataset_default`)
WEBDATASET_DEFAULTS = ("default_cache_dir", "default_cache_size", "verbose_cache")


def webdataset_default(name: str) -> Any:
    """webdataset's ``cache.<name>``, as the environment says now: ``default_cache_dir``
    (``WDS_CACHE``, else ``"./_cache"``), ``default_cache_size`` (``WDS_CACHE_SIZE`` in bytes,
    else ``1e18``, a float) or ``verbose_cache`` (``WDS_VERBOSE_CACHE``, 0 or 1)."""
    environ = Settings.from_env().environ
    if name == "default_cache_dir":
        return environ.get("WDS_CACHE", "./_cache")
    if name == "default_cache_size":
        size = Settings.from_env().cache_size
        return float(size) if size is not None else 1e18
    if name == "verbose_cache":
        return int(Settings.from_env().verbose_cache)
    raise KeyError(name)


def default_cache_dir_of(settings: Settings) -> str:
    """The directory of a ``FileCache`` made without one: ``wds.cache.default_cache_dir`` when
    it was set, else ``WDS_CACHE`` (``settings.cache_dir``), else ``./_cache``."""
    package = sys.modules.get(__name__.rpartition(".")[0])
    chosen = None if package is None else vars(package).get("default_cache_dir")
    return str(chosen) if chosen is not None else settings.cache_dir or "./_cache"


def islocal(url: str) -> bool:
    """Whether ``url`` is a local path or a ``file:`` URL."""
    return urlparse(url).scheme in ("", "file")


def magic_filetype(fname: str) -> str:
    """``"<fname>: gzip compressed data"``, ``": POSIX tar archive"`` or ``": data"``, from the
    first bytes of file ``fname``."""
    with open(fname, "rb") as f:
        header = f.read(512)
    if header[:2] == b"\x1f\x8b":
        return f"{fname}: gzip compressed data"
    if len(header) > 261 and header[257:262] == b"ustar":
        return f"{fname}: POSIX tar archive"
    return f"{fname}: data"


def get_filetype(fname: str) -> str:
    """The output of the ``file`` command for ``fname`` (``AssertionError`` if the file or the
    command is missing, as in webdataset)."""
    if not os.path.exists(fname):
        raise AssertionError(fname)
    try:
        subprocess.run(["file", "."], stdout=subprocess.DEVNULL, check=True)
    except (subprocess.SubprocessError, FileNotFoundError) as exc:
        raise AssertionError("UNIX/Linux file command not available") from exc
    return subprocess.run(["file", fname], stdout=subprocess.PIPE, text=True,
                          check=True).stdout


def download(url: str, dest: str, chunk_size: int = 1024**2, verbose: bool = False) -> None:
    """Copy ``url`` (opened with :func:`wds_cloud.gopen`) to the file ``dest``, through a
    temporary file renamed into place at the end."""
    from ..router import gopen  # the router is a layer up from the cache

    temp = dest + f".temp{os.getpid()}"
    with gopen(url) as stream, open(temp, "wb") as f:
        while data := stream.read(chunk_size):
            f.write(data)
    os.rename(temp, dest)
