"""Settings: the one module of wds_cloud that reads the environment.

A frozen :class:`Settings` is built once (``Settings.from_env()``) at the composition root and
passed down. Explicit arguments beat settings, settings beat defaults; ``trust_env=False``
ignores the environment altogether.

=======================  ==================================================================
variable                 meaning
=======================  ==================================================================
``WDS_REWRITE``          URL rewrite rules, ``regex=replacement;regex=replacement``
                         (``GOPEN_REWRITE``, webdataset's own name for it, is read too)
``AIS_ENDPOINT``         AIStore gateway, e.g. ``http://aistore:51080``
``USE_AIS_FOR``          colon-separated schemes to fetch through AIStore, e.g. ``gs:s3``
``WDS_CACHE``            shard cache directory; setting it turns caching on
``WDS_CACHE_SIZE``       cache bound in bytes (``1e9``, ``50GB``, ``500MiB``)
``WDS_VERBOSE_CACHE``    ``1``: one log line per cache hit, miss, fill and eviction
``GOPEN_VERBOSE``        ``1`` (any non-zero integer, or true/yes/on): webdataset's lines on
                         stderr, ``GOPEN <url> {}`` for each URL opened and one line when its
                         stream ends (:mod:`wds_cloud.io.verbose`; URLs redacted)
``WDS_CACHE_REVALIDATE`` ``1``: ask the store on each cache hit whether the shard changed
                         (ETag, generation) and fetch it again if it did
``WDS_CACHE_LOCAL``      ``1``: cache local and NAS paths too (for slow network file systems)
``WDS_SECURE``           ``1``: refuse what can run code: unpickling (``.pyd``, ``.pickle``),
                         ``torch.load`` (``.pth``) and ``pipe:`` URLs (``wds.utils.
                         enforce_security = True`` refuses more, as webdataset does)
``WDS_PYTORCH_WEIGHTS_ONLY`` ``1``: ``torch.load`` of ``.pth`` samples with ``weights_only=True``
``WDS_SEED``             the seed of shard shuffling and resampling when none is given
``WDS_RETRIES``          retries after a failed request or dropped connection before giving
                         up (default 8: a transfer ends after 9 attempts in a row failed)
``WDS_RETRY_BACKOFF``    first backoff delay in seconds, doubled each retry (default 0.2)
``WDS_RETRY_BACKOFF_MAX`` longest backoff delay in seconds (default 10)
``WDS_TIMEOUT``          seconds to wait for a connection or for the next bytes (default 60)
``WDS_READAHEAD``        most shards opened ahead of the one being read, per worker, once
                         pre-reading pays (default 16: enough to hide 50 ms to a first byte
                         behind 4 MB shards); until then one (a GET each); 0: off
``WDS_READAHEAD_BYTES``  bytes pre-read in all the shards opened ahead, once that pays (the
                         reader's own reads come slower than 512 MiB/s; default 64MiB)
``WDS_<NAME>``           value of ``${NAME}`` in shard URLs
``RANK``, ``WORLD_SIZE`` node rank and count, before ``torch.distributed``
``WORKER``,              worker index and count, before ``torch.utils.data.get_worker_info``
``NUM_WORKERS``
=======================  ==================================================================

Cloud credentials (``AWS_*``, ``GOOGLE_*``, ``AZURE_*``) are the SDKs' business and are never
read here.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from .errors import ConfigError

__all__ = ["Settings", "expand_path", "human_size", "parse_bool", "parse_size"]

_SIZE_UNITS = {
    "": 1, "b": 1,
    "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
    "t": 10**12, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def parse_size(value: str | int | float, *, name: str = "size") -> int:
    """Parse ``1e9``, ``50GB``, ``500MiB`` or a plain number of bytes into an int."""
    if isinstance(value, bool):
        raise ConfigError(f"{name}: expected a size in bytes, got {value!r}")
    if isinstance(value, (int, float)):
        if value < 0:
            raise ConfigError(f"{name}: a size cannot be negative, got {value!r}")
        return int(value)
    m = _SIZE_RE.match(value)
    unit = m.group(2).lower() if m else ""
    if not m or unit not in _SIZE_UNITS:
        raise ConfigError(
            f"{name}: cannot read {value!r} as a size; write bytes as e.g. 1e9, 50GB or 500MiB"
        )
    return int(float(m.group(1)) * _SIZE_UNITS[unit])


def expand_path(path: str | os.PathLike[str]) -> str:
    """``path`` with ``~`` and ``$VARS`` expanded, made absolute."""
    return os.path.abspath(os.path.expandvars(os.path.expanduser(os.fspath(path))))


def human_size(n: float) -> str:
    """``1536`` -> ``'1.5 KiB'`` (binary units; the inverse of :func:`parse_size`)."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def parse_bool(value: str, *, name: str) -> bool:
    """Parse an environment flag (``1/0``, ``true/false``, ``yes/no``, ``on/off``)."""
    v = value.strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise ConfigError(f"{name}: expected 1/0, true/false, yes/no or on/off, got {value!r}")


def _float(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name}: expected a number of seconds, got {raw!r}") from None
    if value < 0:
        raise ConfigError(f"{name}: cannot be negative, got {raw!r}")
    return value


def _int(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"{name}: expected an integer, got {raw!r}") from None


def _verbose(raw: str) -> bool:
    """``GOPEN_VERBOSE``: webdataset reads it as an integer (non-zero: on); flag words too."""
    try:
        return int(raw.strip()) != 0
    except ValueError:
        return parse_bool(raw, name="GOPEN_VERBOSE")


def _seed(env: Mapping[str, str]) -> int | None:
    raw = env.get("WDS_SEED")
    if raw is None or raw.strip() == "":
        return None
    try:
        return int(raw.strip())
    except ValueError:
        raise ConfigError(f"WDS_SEED must be an integer seed, got {raw!r}") from None


@dataclass(frozen=True)
class Settings:
    """Everything wds_cloud takes from the environment, read once."""

    rewrite: str | None = None
    rewrite_var: str = "WDS_REWRITE"
    ais_endpoint: str | None = None
    use_ais_for: tuple[str, ...] = ()
    cache_dir: str | None = None
    cache_size: int | None = None
    verbose_cache: bool = False
    gopen_verbose: bool = False
    cache_revalidate: bool = False
    cache_local: bool = False
    secure: bool = False
    pytorch_weights_only: bool = False
    seed: int | None = None
    retries: int = 8
    retry_backoff: float = 0.2
    retry_backoff_max: float = 10.0
    timeout: float = 60.0
    readahead: int = 16
    readahead_bytes: int = 64 * 2**20
    rank: int | None = None
    world_size: int | None = None
    worker: int | None = None
    num_workers: int | None = None
    url_vars: Mapping[str, str] = field(default_factory=dict)
    #: the variables a dataset spec's ``${VAR}`` may name (all of the environment, as
    #: webdataset's ``os.path.expandvars``); never shown, it may hold secrets
    environ: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, *, trust_env: bool = True
    ) -> Settings:
        """Read ``environ`` (default ``os.environ``); ``trust_env=False`` ignores it."""
        if not trust_env:
            return cls()
        env = os.environ if environ is None else environ
        rewrite_var = "WDS_REWRITE" if "WDS_REWRITE" in env else "GOPEN_REWRITE"
        use_ais = tuple(s for s in env.get("USE_AIS_FOR", "").split(":") if s.strip())
        size = env.get("WDS_CACHE_SIZE")
        cache_dir = env.get("WDS_CACHE") or None
        retries = _int(env, "WDS_RETRIES")
        readahead = _int(env, "WDS_READAHEAD")
        for name, value in (("WDS_RETRIES", retries), ("WDS_READAHEAD", readahead)):
            if value is not None and value < 0:
                raise ConfigError(f"{name}: cannot be negative, got {value}")
        ra_bytes = env.get("WDS_READAHEAD_BYTES")
        return cls(
            rewrite=env.get(rewrite_var) or None,
            rewrite_var=rewrite_var,
            ais_endpoint=env.get("AIS_ENDPOINT") or None,
            use_ais_for=tuple(s.strip() for s in use_ais),
            cache_dir=expand_path(cache_dir) if cache_dir else None,
            cache_size=parse_size(size, name="WDS_CACHE_SIZE") if size else None,
            verbose_cache=parse_bool(env.get("WDS_VERBOSE_CACHE", ""), name="WDS_VERBOSE_CACHE"),
            gopen_verbose=_verbose(env.get("GOPEN_VERBOSE", "")),
            cache_revalidate=parse_bool(env.get("WDS_CACHE_REVALIDATE", ""),
                                        name="WDS_CACHE_REVALIDATE"),
            cache_local=parse_bool(env.get("WDS_CACHE_LOCAL", ""), name="WDS_CACHE_LOCAL"),
            secure=parse_bool(env.get("WDS_SECURE", ""), name="WDS_SECURE"),
            pytorch_weights_only=parse_bool(env.get("WDS_PYTORCH_WEIGHTS_ONLY", ""),
                                            name="WDS_PYTORCH_WEIGHTS_ONLY"),
            seed=_seed(env),
            retries=cls.retries if retries is None else retries,
            retry_backoff=_float(env, "WDS_RETRY_BACKOFF", cls.retry_backoff),
            retry_backoff_max=_float(env, "WDS_RETRY_BACKOFF_MAX", cls.retry_backoff_max),
            timeout=_float(env, "WDS_TIMEOUT", cls.timeout),
            readahead=cls.readahead if readahead is None else readahead,
            readahead_bytes=(parse_size(ra_bytes, name="WDS_READAHEAD_BYTES") if ra_bytes
                             else cls.readahead_bytes),
            rank=_int(env, "RANK"),
            world_size=_int(env, "WORLD_SIZE"),
            worker=_int(env, "WORKER"),
            num_workers=_int(env, "NUM_WORKERS"),
            url_vars={k[4:]: v for k, v in env.items() if k.startswith("WDS_") and len(k) > 4},
            environ=dict(env),
        )
