"""Shard lists, node/worker splitting and the seeds of every per-stream random choice.

Layer 2: no torch, no schemes. Whoever needs to know which rank and worker it runs in takes a
``worker_info`` argument: a :class:`WorkerInfo` value, or a zero-argument callable returning one
(called lazily, inside the DataLoader worker). ``None`` means "from the environment only"
(``RANK``/``WORLD_SIZE``/``WORKER``/``NUM_WORKERS`` via :class:`~wds_cloud.settings.Settings`);
the torch-aware versions exported as ``wds_cloud.split_by_node`` etc. live in
:mod:`wds_cloud.pytorch` and also ask ``torch.distributed`` and the DataLoader.

Randomness: every random choice made per (rank, worker, epoch) is seeded by :func:`derive_seed`,
a stable hash (except a seeded ``SimpleShardList``, in webdataset's order unless ``set_epoch``
numbers its epochs); nothing uses the module-global ``random``.

Epochs: webdataset counts epochs inside the dataset object, but a DataLoader with
non-persistent workers pickles the object afresh into new workers every epoch, so the counter
restarts and every epoch repeats. Here an iteration is identified by the pair ``(n, k)``: ``n``
is the value of the last :meth:`set_epoch` call (``WebLoader`` calls it before each epoch, in the
main process, before the workers start) and ``k`` the number of iterations this copy of the
object has started since then (so persistent workers, which never see later ``set_epoch`` calls,
and ``with_epoch`` repetitions still advance). Without ``set_epoch`` the key is ``(k,)``, and
when the code runs in a torch DataLoader worker the worker's torch seed (``WorkerInfo.seed``:
torch's base seed, drawn anew for each epoch and reproducible under ``torch.manual_seed``, plus
the worker id) is mixed in as well, so even a plain ``DataLoader`` sees new shards each epoch.
``SimpleShardList`` never mixes in the torch seed: every rank and worker must agree on its order.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import os
import random
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from ..errors import ConfigError
from ..settings import Settings
from ..urls import expand_urls

__all__ = [
    "ShardResampler",
    "ShardShuffle",
    "SimpleShardList",
    "WorkerInfo",
    "WorkerInfoSource",
    "derive_seed",
    "expand_source",
    "node_share",
    "non_empty",
    "require_single_node",
    "resample_items",
    "resolve_worker_info",
    "shardspec",
    "worker_share",
]

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class WorkerInfo:
    """Where code runs: node ``rank`` of ``world_size``, DataLoader ``worker`` of ``num_workers``.

    ``seed`` is torch's seed for this DataLoader worker (``get_worker_info().seed``) when known,
    else ``None``. The defaults describe a single process.
    """

    rank: int = 0
    world_size: int = 1
    worker: int = 0
    num_workers: int = 1
    seed: int | None = None

    def __post_init__(self) -> None:
        for index, count, what in (
            (self.rank, self.world_size, "rank/world_size (RANK/WORLD_SIZE)"),
            (self.worker, self.num_workers, "worker/num_workers (WORKER/NUM_WORKERS)"),
        ):
            if count < 1 or not 0 <= index < count:
                raise ConfigError(
                    f"invalid {what}: {index}/{count}; need a count >= 1 and 0 <= index < count"
                )

    @classmethod
    def from_settings(cls, settings: Settings) -> WorkerInfo:
        """Rank and worker from the environment settings only; unset pairs mean single process.

        As in webdataset, a pair is used only when both of its variables are set.
        """
        rank, world = settings.rank, settings.world_size
        worker, workers = settings.worker, settings.num_workers
        both_node = rank is not None and world is not None
        both_worker = worker is not None and workers is not None
        return cls(
            rank=rank if both_node and rank is not None else 0,
            world_size=world if both_node and world is not None else 1,
            worker=worker if both_worker and worker is not None else 0,
            num_workers=workers if both_worker and workers is not None else 1,
        )


WorkerInfoSource = WorkerInfo | Callable[[], WorkerInfo] | None

#: the saved worker a slot of a resumed run plays while it computes its next item
#: (:mod:`wds_cloud.pipeline.slots`): every lookup of "where am I" answers it meanwhile
playing: WorkerInfo | None = None


def resolve_worker_info(source: WorkerInfoSource) -> WorkerInfo:
    """Turn a ``worker_info`` argument into a value (``None``: from the environment only);
    the slot being played, while one is (:data:`playing`)."""
    if playing is not None:
        return playing
    if source is None:
        return WorkerInfo.from_settings(Settings.from_env())
    if isinstance(source, WorkerInfo):
        return source
    info = source()
    if not isinstance(info, WorkerInfo):
        raise ConfigError(
            f"worker_info callable {source!r} returned {type(info).__name__}, expected WorkerInfo"
        )
    return info


def derive_seed(base: int, rank: int, worker: int, epoch: int, *salt: int) -> int:
    """Seed for the stream of (``rank``, ``worker``, ``epoch``) given a ``base`` seed.

    A stable hash (blake2b) of all arguments: the same in every process, platform and Python
    version (unlike ``hash()``), and unrelated for neighbouring inputs. ``salt`` values (e.g.
    torch's worker seed, or fresh entropy) are mixed in after the four. Returns a 63-bit int.
    """
    values = (base, rank, worker, epoch, *salt)
    for v in values:
        if not isinstance(v, int) or isinstance(v, bool):
            raise TypeError(f"derive_seed takes ints, got {v!r} ({type(v).__name__})")
    digest = hashlib.blake2b(repr(values).encode("ascii"), digest_size=8, person=b"wds_cloud")
    return int.from_bytes(digest.digest(), "big") >> 1


def _entropy() -> int:
    return int.from_bytes(os.urandom(8), "big")


class _Epochs:
    """Epoch numbering shared by the shard lists (see the module docstring)."""

    def __init__(self) -> None:
        self.explicit: int | None = None
        self.started = 0

    def set(self, epoch: int) -> None:
        self.explicit = int(epoch)
        self.started = 0

    def next(self) -> tuple[tuple[int, ...], bool]:
        """Key of the iteration that starts now, and whether ``set_epoch`` was ever called.

        The key is ``(n, k)`` after ``set_epoch(n)`` and ``k`` earlier iterations, ``(k,)``
        without ``set_epoch``: distinct for every iteration of every copy of the object.
        """
        k = self.started
        self.started += 1
        if self.explicit is None:
            return (k,), False
        return (self.explicit, k), True

    def next_seed(
        self, base: int, worker_info: WorkerInfoSource, *,
        ident: tuple[int, int] | None = None, fresh: bool = False,
    ) -> tuple[int, tuple[int, int], tuple[int, ...]]:
        """``(seed, identity, epoch key)`` of the iteration that starts now.

        The seed is ``derive_seed(base, rank, worker, *epoch key)`` (``ident`` replaces
        rank and worker), salted with torch's worker seed when ``set_epoch`` was never
        called, and with fresh entropy when ``fresh``.
        """
        key, explicit = self.next()
        info = resolve_worker_info(worker_info)
        who = (info.rank, info.worker) if ident is None else ident
        salt: list[int] = []
        if not explicit and info.seed is not None:
            salt.append(info.seed)
        if fresh:
            salt.append(_entropy())
        return derive_seed(base, *who, *key, *salt), who, key


def _check_urls(urls: list[Any], spec: object, *, empty_ok: bool = False) -> list[str]:
    for url in urls:
        if not isinstance(url, str):
            raise ConfigError(
                f"shard URLs must be strings, got {type(url).__name__} {url!r} in {spec!r}"
            )
    if not urls and not empty_ok:
        raise ConfigError(
            f"empty shard list: {spec!r} expands to no URLs; give a URL, a brace pattern such as "
            "'shard-{000000..000009}.tar' or a non-empty list"
        )
    return urls


def expand_source(
    source: str | Iterable[str], max_urls: int = int(1e9), *,
    url_vars: Mapping[str, str] | None = None,
) -> list[str]:
    """A shard spec as a list of URLs.

    A string is expanded (braces, ``::`` joins, ``${NAME}`` from ``url_vars``: the values of
    the ``WDS_NAME`` variables, as the composition root read them); a list is taken as is (no
    brace expansion, as in webdataset); any other iterable is read up to ``max_urls``.
    ``url_vars=None`` is for a shard list built on its own, as its own composition root: the
    environment is then read, and only if the spec has a ``${NAME}``.
    """
    if isinstance(source, str):
        if url_vars is None:
            url_vars = Settings.from_env().url_vars if "${" in source else {}
        return expand_urls(source, url_vars=url_vars)
    if isinstance(source, (list, tuple)):
        return list(source)
    if isinstance(source, Iterable):
        return list(itertools.islice(source, max_urls))
    raise ConfigError(
        f"cannot use {type(source).__name__} {source!r} as shard URLs: "
        "give a string (brace pattern) or a list of strings"
    )


class SimpleShardList:
    """Yield ``dict(url=...)`` for each shard URL, once per iteration.

    ``urls``: a string (brace pattern, ``::``-joined lists, ``${NAME}`` from ``WDS_NAME``) or
    an iterable of URL strings. ``seed``: ``None`` keeps the order; an int shuffles, with
    the same permutation on every rank and worker (so it can be split): webdataset 1.0.2's
    order for that seed, ``random.Random(seed).shuffle``, in every iteration, as webdataset
    gives it (so a published run repeats when switching libraries; ``seed`` may be changed
    between iterations, as webdataset's tests do). A new order each epoch is wds_cloud's
    extension, asked for with :meth:`set_epoch` (``WebLoader`` calls it): epoch 0 keeps
    webdataset's order, the others are shuffled by ``derive_seed(seed, 0, 0, *epoch)``.
    ``True`` picks a random seed now (each node then has its own: do not combine with
    splitting by node).
    """

    def __init__(
        self, urls: str | Iterable[str], seed: int | bool | None = None, *,
        url_vars: Mapping[str, str] | None = None,
    ) -> None:
        self.urls = _check_urls(expand_source(urls, url_vars=url_vars), urls)
        if seed is True:
            seed = _entropy()
        elif seed is False:
            seed = None
        self.seed: int | None = seed
        self._epochs = _Epochs()

    def set_epoch(self, epoch: int) -> None:
        """Number the next iteration ``epoch`` (see the module docstring)."""
        self._epochs.set(epoch)

    def __len__(self) -> int:
        return len(self.urls)

    def __iter__(self) -> Iterator[dict[str, str]]:
        key, explicit = self._epochs.next()
        urls = self.urls
        if self.seed is not None:
            urls = list(urls)
            webdataset_order = not explicit or key == (0, 0)  # see the class docstring
            seed = self.seed if webdataset_order else derive_seed(self.seed, 0, 0, *key)
            random.Random(seed).shuffle(urls)
        for url in urls:
            yield {"url": url}

    def __repr__(self) -> str:
        return f"SimpleShardList({len(self.urls)} urls, seed={self.seed!r})"


class ShardResampler:
    """Yield ``nshards`` URLs drawn with replacement: ``dict(url=...)``, endlessly by default.

    Each (rank, worker, epoch) draws a different stream. With ``deterministic=True`` the stream
    is a function of ``seed``, rank, worker and epoch (plus torch's worker seed when
    ``set_epoch`` is never called, see the module docstring), so runs repeat exactly; with
    ``deterministic=False`` (webdataset's default) fresh entropy is mixed in and every run
    differs. ``worker_seed``: a zero-argument callable whose int replaces the (rank, worker)
    identity. ``max_urls`` caps how many URLs are read from a non-list iterable;
    ``empty_check`` raises :class:`ConfigError` for an empty list.

    As in webdataset, ``epoch`` is the number of the iteration last started (-1 before the
    first; counted from the last ``set_epoch``), and assigning it chooses the next one
    (``epoch + 1``); ``rng`` is the generator of the iteration under way.
    """

    def __init__(
        self,
        urls: str | Iterable[str],
        nshards: int = sys.maxsize,
        seed: int = 0,
        worker_seed: Callable[[], int] | None = None,
        deterministic: bool = False,
        max_urls: int = int(1e6),
        empty_check: bool = True,
        *,
        worker_info: WorkerInfoSource = None,
        url_vars: Mapping[str, str] | None = None,
    ) -> None:
        self.urls = _check_urls(expand_source(urls, max_urls, url_vars=url_vars), urls,
                                empty_ok=not empty_check)
        if nshards < 0:
            raise ConfigError(f"ResampledShards: nshards must be >= 0, got {nshards}")
        self.nshards = nshards
        self.seed = seed
        self.worker_seed = worker_seed
        self.deterministic = deterministic
        self.worker_info = worker_info
        self._epochs = _Epochs()
        self.rng: random.Random | None = None

    @property
    def epoch(self) -> int:
        """webdataset's counter: the iteration last started, -1 before the first."""
        return self._epochs.started - 1

    @epoch.setter
    def epoch(self, value: int) -> None:
        self._epochs.started = int(value) + 1

    def set_epoch(self, epoch: int) -> None:
        """Number the next iteration ``epoch`` (see the module docstring)."""
        self._epochs.set(epoch)

    def stream_seed(self) -> int:
        """The seed of the iteration that starts now (advances the epoch)."""
        ident = None if self.worker_seed is None else (self.worker_seed(), -1)
        seed, ident, key = self._epochs.next_seed(
            self.seed, self.worker_info, ident=ident, fresh=not self.deterministic)
        log.debug("ResampledShards rank/worker=%s epoch=%s seed=%s", ident, key, seed)
        return seed

    def __iter__(self) -> Iterator[dict[str, str]]:
        seed = self.stream_seed()
        urls = self.urls
        if not urls:
            return
        self.rng = random.Random(seed)
        pick = self.rng.randrange
        n = len(urls)
        for _ in range(self.nshards):
            yield {"url": urls[pick(n)]}

    def __repr__(self) -> str:
        return (
            f"ResampledShards({len(self.urls)} urls, nshards={self.nshards}, seed={self.seed}, "
            f"deterministic={self.deterministic})"
        )


class ShardShuffle:
    """A pipeline stage shuffling shards in a buffer of ``bufsize``, a new order each epoch.

    The seed of an iteration is ``derive_seed(seed, rank, worker, *epoch)`` (plus torch's
    worker seed when ``set_epoch`` is never called). ``WebDataset(shardshuffle=n)`` uses it;
    webdataset reused one fixed seed, so every epoch saw the same shard order.
    """

    def __init__(self, bufsize: int, *, seed: int, worker_info: WorkerInfoSource = None) -> None:
        self.bufsize = bufsize
        self.seed = seed
        self.worker_info = worker_info
        self._epochs = _Epochs()

    def set_epoch(self, epoch: int) -> None:
        """Number the next iteration ``epoch``."""
        self._epochs.set(epoch)

    def __call__(self, src: Iterable[T]) -> Iterator[T]:
        from .filters import shuffle

        seed = self._epochs.next_seed(self.seed, self.worker_info)[0]
        return iter(shuffle(self.bufsize, seed=seed)(iter(src)))

    def __repr__(self) -> str:  # says "shuffle", which webdataset's tests look for in a stage
        return f"ShardShuffle(bufsize={self.bufsize}, seed={self.seed}): a shard shuffle"


def node_share(
    src: Iterable[T], group: object = None, *, worker_info: WorkerInfoSource = None
) -> Iterator[T]:
    """Keep every ``world_size``-th item starting at ``rank``.

    ``group`` (a torch process group) needs torch: use ``wds_cloud.split_by_node``.
    """
    if group is not None:
        raise ConfigError(
            "node_share cannot use a torch process group; use "
            "wds_cloud.split_by_node(src, group) or pass worker_info="
        )
    info = resolve_worker_info(worker_info)
    if info.world_size > 1:
        yield from itertools.islice(src, info.rank, None, info.world_size)
    else:
        yield from src


def worker_share(src: Iterable[T], *, worker_info: WorkerInfoSource = None) -> Iterator[T]:
    """Keep every ``num_workers``-th item starting at ``worker``."""
    info = resolve_worker_info(worker_info)
    if info.num_workers > 1:
        yield from itertools.islice(src, info.worker, None, info.num_workers)
    else:
        yield from src


def require_single_node(
    src: Iterable[T], group: object = None, *, worker_info: WorkerInfoSource = None
) -> Iterator[T]:
    """Pass items through; raise :class:`ConfigError` when running on more than one node."""
    if group is not None:
        raise ConfigError(
            "require_single_node cannot use a torch process group; use "
            "wds_cloud.single_node_only(src, group) or pass worker_info="
        )
    info = resolve_worker_info(worker_info)
    if info.world_size > 1:
        raise ConfigError(
            f"this pipeline is single-node only but runs as rank {info.rank} of "
            f"{info.world_size}; split the shards between nodes, e.g. "
            "WebDataset(urls, nodesplitter=wds.split_by_node)"
        )
    yield from src


def non_empty(src: Iterable[T]) -> Iterator[T]:
    """Pass items through; raise :class:`ConfigError` (a ValueError) if there were none."""
    empty = True
    for item in src:
        empty = False
        yield item
    if empty:
        raise ConfigError(
            "empty shard list: this pipeline stage received no items at all; check the URLs, "
            "and that there are at least as many shards as nodes x workers"
        )


def resample_items(
    src: Iterable[T], n: int = sys.maxsize, *, seed: int | None = None,
    worker_info: WorkerInfoSource = None,
) -> Iterator[T]:
    """Stage ``resampled(n)``: collect the input, then yield ``n`` items drawn with replacement.

    ``seed=None`` (webdataset's behaviour) draws fresh entropy; an int seed gives
    ``derive_seed(seed, rank, worker, 0)`` plus torch's worker seed in a DataLoader worker.
    """
    items = list(src)
    if not items:
        return
    info = resolve_worker_info(worker_info)
    salt = () if info.seed is None else (info.seed,)
    base = _entropy() if seed is None else seed
    rng = random.Random(derive_seed(base, info.rank, info.worker, 0, *salt))
    for _ in range(n):
        yield items[rng.randrange(len(items))]



def shardspec(spec: str) -> SimpleShardList:
    """A shard list from a spec string (brace pattern); a YAML spec (``.yaml``/``.yml``) is
    read by ``wds.MultiShardSample(path)`` (shards) or ``wds.WebDataset(path)`` (samples)."""
    if spec.endswith((".yaml", ".yml")):
        raise ConfigError(
            f"{spec!r}: a YAML dataset spec is read by wds.MultiShardSample({spec!r}) (a stream "
            f"of shards, webdataset's shardspec) or wds.WebDataset({spec!r}) (mixed samples)"
        )
    return SimpleShardList(spec)
