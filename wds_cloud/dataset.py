"""webdataset's ``WebDataset`` and ``FluidWrapper``, and the tar functions bound to gopen.

This is the composition root: it binds the layer-2 functions (which take an ``open_stream``
argument) to :func:`wds_cloud.router.gopen`, and the shard splitters to
:func:`wds_cloud.pytorch.worker_info`. It never imports torch: a dataset is a torch
``IterableDataset`` once torch is imported, before or after it is built (see
:mod:`wds_cloud.pytorch`).

``WebDataset`` takes webdataset 1.0.2's arguments. Where webdataset silently ignored one, we
use it or refuse it:

* ``repeat=True`` repeats the dataset forever (webdataset 1.0.2 ignored it);
* ``verbose=True`` logs each shard as it is opened (logger ``wds_cloud.dataset``, level INFO);
* ``cache_dir`` and ``cache_size`` (bytes, or ``"50GB"``) read shards through the on-disk
  shard cache (:mod:`wds_cloud.cache`), overriding ``WDS_CACHE``/``WDS_CACHE_SIZE``;
  ``cache_size=-1`` (the default) takes ``WDS_CACHE_SIZE`` or no bound, ``0`` turns the cache
  off; ``url_to_name`` gives the readable part of cache file names, to which a hash of the URL
  is always added (webdataset's basenames collided across buckets); keyword-only
  ``cache_revalidate`` and ``cache_local`` override ``WDS_CACHE_REVALIDATE``/``WDS_CACHE_LOCAL``;
* a URL ending in ``/`` (a directory, a bucket prefix) is the shards directly in it
  (``*.tar``, ``*.tgz``, ``*.tar.gz``), listed once, as the CLI and specs read it; with a
  ``mode`` (or as a ``DirectoryShardList``) it is webdataset's queue of shards instead,
  ``mode`` giving what happens to a shard once read (``"resample"``, ``"keep"``,
  ``"unlink"``); each process claims the shards it reads, so no node or worker splitter and
  no shard shuffle is applied (webdataset 1.0.2 made every such URL a queue, whose default
  pattern matched nothing: it waited forever);
* a dataset spec (a ``.yaml``/``.yml``/``.json`` path, a dict or a ``DatasetSpec``) mixes its
  sources (:mod:`wds_cloud.specdataset`); the shard list arguments (``resampled``,
  ``shardshuffle``, the splitters, ``empty_check``) do not apply to it, and keyword-only
  ``allow_pipe=True`` lets its shards be ``pipe:`` commands;
* keyword-only ``epoch_mode="exact"`` deals each epoch's shards (permuted with the seed, the
  same on every rank) to the rank x worker slots, the same number to each (``remainder="pad"``
  repeats a few, ``"drop"`` leaves a few out): see :mod:`wds_cloud.pipeline.exact`; without a
  chosen seed (argument or ``WDS_SEED``) it uses 0, so that all ranks agree;
* ``shardshuffle=n`` shuffles shards with a seed derived per rank, worker and epoch, so each
  epoch has a new order (webdataset repeated one order); ``detshuffle=True`` keeps webdataset's
  ``detshuffle`` stage (``Random(seed + epoch)``), whose epoch ``set_epoch`` also sets.
* ``storage_options`` (keyword-only, per scheme: ``{"s3": {...}, "gs": {...}}``) go to the
  fsspec filesystems; shard patterns with ``*``/``?``/``[...]`` (``s3://b/train/shard-*.tar``)
  are listed once, when the dataset is built;
* ``seed=None`` takes ``WDS_SEED`` (an integer) if set, else a random seed, as webdataset;
  with ``resampled=True`` a chosen seed (argument or ``WDS_SEED``) makes the resampled shard
  streams reproducible (``ResampledShards(seed=seed, deterministic=True)``; webdataset ignored
  the seed there), while no seed keeps webdataset's non-deterministic resampling;
* keyword-only ``zero_copy=True`` hands out the members of local and cached shards (read
  through a memory map) as ``memoryview`` slices of the map instead of ``bytes``: no copy,
  for consumers that take any buffer (``np.frombuffer``, ``torch.frombuffer``); each view
  keeps its shard's map open while it lives, ``decode()`` turns views into ``bytes`` for its
  handlers; members are ``bytes`` in DataLoader workers (their items are pickled) and from
  other shards (remote, compressed, piped).

As webdataset's module path ``webdataset.tariterators`` (an alias of this module) it also holds
``meta_prefix``, ``meta_suffix``, ``shardlist`` and ``trace``; the debugging switch that
:func:`group_by_keys` reads is ``wds_cloud.tar.samples.trace`` (its home), not the copy here.
"""

from __future__ import annotations

import functools
import logging
import random
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, BinaryIO

from .errors import ConfigError
from .handlers import Handler, reraise_exception
from .pipeline import filters, shards
from .pipeline.core import pipelinefilter
from .pipeline.epochs import EpochCounter
from .pipeline.fluid import FluidInterface

# re-exported: webdataset code reaches them as ``wds.tariterators.*``
from .pipeline.shardnames import shardlist
from .pipeline.shards import WorkerInfo
from .pipeline.state import ResumeBook, fingerprint
from .pytorch import (
    DataPipeline,
    single_node_only,
    split_by_worker,
    worker_info,
)
from .reading import ReaderShuffle, ShardOpener, ShardReader, read_shards
from .router import gopen
from .settings import Settings
from .shardsource import (
    bind_worker_info,
    cache_settings,
    describe,
    exact_source,
    expand_patterns,
    is_directory,
    is_spec,
    refuse_unsupported,
    resolve_seed,
    shard_source,
    shardshuffle_size,
)
from .tar import samples as tario
from .tar.samples import (
    base_plus_ext,
    group_by_keys,
    meta_prefix,
    meta_suffix,
    tar_file_expander,
    tar_file_iterator,
    trace,
    valid_sample,
)
from .urls import redact

__all__ = [
    "FluidInterface",
    "FluidWrapper",
    "WebDataset",
    "base_plus_ext",
    "cbors_to_samples",
    "check_empty",
    "group_by_keys",
    "meta_prefix",
    "meta_suffix",
    "msgpacks_to_samples",
    "read_shards",
    "shardlist",
    "tar_file_expander",
    "tar_file_iterator",
    "tarfile_samples",
    "tarfile_to_samples",
    "trace",
    "url_opener",
    "valid_sample",
]

log = logging.getLogger(__name__)

Sample = dict[str, Any]


def _open(url: str, **kw: Any) -> BinaryIO:
    return gopen(url, "rb", **kw)


def tarfile_samples(
    src: Iterable[Sample], handler: Handler = reraise_exception,
    select_files: Callable[[str], bool] | None = None,
    rename_files: Callable[[str], str | None] | None = None, *,
    storage_options: Mapping[str, Any] | None = None, settings: Settings | None = None,
    url_to_name: Callable[[str], str] | None = None,
) -> Iterator[Sample]:
    """Samples from the tar shards named by ``src`` (dicts with ``url``), opened with gopen
    (through the shard cache when the settings name one); the next shards are opened ahead in
    the background (``WDS_READAHEAD``)."""
    opener = ShardOpener(settings or Settings.from_env(), storage_options or {}, url_to_name)
    return opener.samples(src, handler, select_files, rename_files)


tarfile_to_samples = pipelinefilter(tarfile_samples)
"""Stage ``tarfile_to_samples(handler=..., select_files=None, rename_files=None,
storage_options=None)``."""


def url_opener(
    data: Iterable[Sample], handler: Handler = reraise_exception, **kw: Any
) -> Iterator[Sample]:
    """Add ``stream`` (and ``local_path``) to dicts with ``url``; ``kw`` goes to gopen."""
    return tario.open_shards(data, handler, open_stream=_open, **kw)


def cbors_to_samples(src: Iterable[Sample], handler: Handler = reraise_exception) -> Any:
    """Samples from files of CBOR records named by ``src`` (dicts with ``url``), via gopen."""
    from .codecs import records

    return records.cbor_file_samples(src, handler, open_stream=_open)


def msgpacks_to_samples(src: Iterable[Sample], handler: Handler = reraise_exception) -> Any:
    """Samples from files of MsgPack records named by ``src`` (dicts with ``url``), via gopen."""
    from .codecs import records

    return records.msgpack_file_samples(src, handler, open_stream=_open)


class check_empty:
    """Stage: pass samples through; raise ConfigError if this worker got none at all."""

    def __init__(self, what: str = "dataset", *,
                 worker_info: Callable[[], WorkerInfo] = worker_info,
                 book: ResumeBook | None = None) -> None:
        self.what = what
        self.worker_info = worker_info
        self.book = book

    def __call__(self, source: Iterable[Sample]) -> Iterator[Sample]:
        samples = iter(source)
        for sample in samples:  # the first one, then the rest passed through as they come
            yield sample
            yield from samples
            return
        if not (self.book is not None and self.book.restoring):
            info = self.worker_info()
            raise ConfigError(
                f"no samples found in {self.what} (rank {info.rank}/{info.world_size}, worker "
                f"{info.worker}/{info.num_workers}); perhaps there are fewer shards than nodes x "
                "workers, or the shards are empty. Turn this check off with "
                "WebDataset(..., empty_check=False)"
            )


def _log_shards(src: Iterable[Sample]) -> Iterator[Sample]:
    for item in src:
        log.info("WebDataset: opening shard %s", redact(str(item.get("url"))))
        yield item


class WebDataset(DataPipeline, FluidInterface):
    """A pipeline reading samples from WebDataset tar shards, with webdataset 1.0.2's arguments.

    Stages, in order: the shard list (``SimpleShardList``, or ``ResampledShards`` when
    ``resampled``), ``nodesplitter``, ``workersplitter``, the shard shuffle, reading and
    grouping the tar files (``tarfile_to_samples`` with ``handler``, ``select_files`` and
    ``rename_files``), and the empty check. See the module docstring for arguments that
    behave differently from webdataset. A torch ``IterableDataset`` whenever torch is imported
    (it never imports torch itself).
    """

    def __init__(
        self,
        urls: Any,
        handler: Handler = reraise_exception,
        mode: str | None = None,
        resampled: bool = False,
        repeat: bool = False,
        shardshuffle: int | bool | None = None,
        cache_size: int | str = -1,
        cache_dir: str | None = None,
        url_to_name: Callable[[str], str] | None = None,
        detshuffle: bool = False,
        nodesplitter: Callable[[Iterable[Any]], Iterable[Any]] | None = single_node_only,
        workersplitter: Callable[[Iterable[Any]], Iterable[Any]] | None = split_by_worker,
        select_files: Callable[[str], bool] | None = None,
        rename_files: Callable[[str], str | None] | None = None,
        empty_check: bool = True,
        verbose: bool = False,
        seed: int | None = None,
        *,
        storage_options: Mapping[str, Any] | None = None,
        cache_revalidate: bool | None = None,
        cache_local: bool | None = None,
        allow_pipe: bool = False,
        epoch_mode: str | None = None,
        remainder: str = "pad",
        split: str | None = None,
        zero_copy: bool = False,
    ) -> None:
        super().__init__()
        if seed is None:
            # webdataset 1.0.2 draws its seed here from the global random; the same draw
            # (unused) keeps a job's later global draws in step with webdataset's
            random.randint(0, 1000000)
        refuse_unsupported(urls, mode)
        # the composition root: the environment is read here, once, and passed down
        self.settings = settings = cache_settings(
            Settings.from_env(), cache_dir, cache_size, cache_revalidate, cache_local)
        self.worker_info = functools.partial(worker_info, settings)
        if is_spec(urls):
            from .specdataset import spec_source

            self.spec, self.seed, source = spec_source(
                urls, settings=settings, seed=seed, storage_options=storage_options or {},
                url_to_name=url_to_name, handler=handler, select_files=select_files,
                rename_files=rename_files, worker_info=functools.partial(worker_info, settings),
                allow_pipe=allow_pipe, split=split, zero_copy=zero_copy)
            from .spec.build import SpecMix

            chosen = seed is not None or settings.seed is not None or self.spec.seed is not None
            self.book = source.book = ResumeBook(
                "spec", fingerprint(self.spec.describe(), source.urls), self.seed,
                seed_chosen=chosen)
            if isinstance(source, SpecMix):  # its sources may change between save and restore
                from .spec.remix import remap_state

                self.book.endless = True

                self.book.adapt = functools.partial(remap_state, spec=self.spec,
                                                    urls=source.urls,
                                                    now=self.book.fingerprint)
            elif self.spec.mode == "samples":
                self.book.unsupported = ("a spec that counts samples per epoch (Mosaic's "
                                         "proportion/repeat/choose, Energon's "
                                         "blend_epochized) does not resume yet; a weighted "
                                         "one and webdataset's shard lists do")
            self.append(source)
            if repeat:
                self.repeat()
            return
        opener = ShardOpener(settings, storage_options or {}, url_to_name, zero_copy)
        queue = is_directory(urls, mode)  # each process claims its shards: no splitting
        if not queue:
            urls = expand_patterns(urls, settings.url_vars, opener.router)
        if isinstance(urls, (str, list, tuple)):  # for the workers forked from here
            opener.prepare([urls] if isinstance(urls, str) else urls)
        resampled = resampled or mode == "resampled"
        self.seed, chosen = resolve_seed(seed, settings)
        where = functools.partial(worker_info, settings)
        if remainder != "pad" and epoch_mode is None:
            raise ConfigError("WebDataset(remainder=...) goes with epoch_mode='exact'")
        if split is not None:
            raise ConfigError(f"WebDataset(split={split!r}) is for dataset specs (an Energon "
                              "metadataset's splits), not for a shard list")
        if epoch_mode is not None:
            self.append(exact_source(urls, epoch_mode, remainder, resampled,
                                      self.seed if chosen else 0, settings, where))
            self.book = ResumeBook("exact", fingerprint(urls, remainder), self.seed,
                                   seed_chosen=True)
            self.book.unsupported = "epoch_mode='exact' does not resume yet"
            self.append(ShardReader(opener, handler, select_files, rename_files, self.book))
            if repeat:
                self.repeat()
            return
        shardshuffle = shardshuffle_size(shardshuffle, resampled)
        self.book = ResumeBook("shards", fingerprint(urls, resampled, shardshuffle, mode),
                               self.seed, seed_chosen=chosen)
        self.book.endless = resampled
        if resampled and not chosen:
            self.book.unsupported = ("resampled without a seed draws fresh entropy (as "
                                     "webdataset); give seed= (or WDS_SEED) to resume")
        self.append(shard_source(urls, resampled, empty_check, self.seed if chosen else None,
                                  settings.url_vars, mode, storage_options or {}))
        if nodesplitter is not None and not queue:
            self.append(bind_worker_info(nodesplitter, where))
        if workersplitter and not queue:
            self.append(bind_worker_info(workersplitter, where))
        if shardshuffle and not queue:
            if detshuffle:
                self.append(filters.detshuffle(shardshuffle, seed=self.seed))
            else:
                self.append(shards.ShardShuffle(shardshuffle, seed=self.seed, worker_info=where))
        if verbose:
            self.append(_log_shards)
        if queue:
            self.book.unsupported = "a directory queue (DirectoryShardList) does not resume"
        self.append(ShardReader(opener, handler, select_files, rename_files, self.book))
        if empty_check and not queue:  # a worker may find a queue empty
            self.append(check_empty(describe(urls), worker_info=where, book=self.book))
        if repeat:
            self.repeat()

    #: the dataset spec this dataset reads, if it was given one
    spec: Any = None

    def shuffle(self, size: int, **kw: Any) -> Any:
        """Shuffle samples in a buffer of ``size``. For a spec the draws come from
        ``KeyedRandom(seed, epoch, slot, SHUFFLE)`` (unless ``rng=``/``seed=`` is given), so the
        stream stays a function of the seed, rank, worker and epoch. Right after the reader
        (before ``decode``/``map``), the buffer is part of the resumable state; elsewhere a
        state cannot be restored."""
        plain = size >= 1 and not kw.keys() - {"initial", "handler"}
        reader = self._reader()
        if self.spec is not None and plain and len(self.pipeline) == 1:
            from .spec.build import SpecShuffle

            return self.compose(SpecShuffle(self.pipeline[0], size, kw.get("initial", 100)))
        if reader is not None and plain and isinstance(self.pipeline[-1], (ShardReader,
                                                                          check_empty)):
            return self.compose(ReaderShuffle(reader, size, kw.get("initial", 100)))
        if self.book is not None:
            self.book.unsupported = ("a .shuffle() after other stages (put it right after the "
                                     "dataset, before decode/map, to resume)")
        return super().shuffle(size, **kw)

    def _reader(self) -> ShardReader | None:
        return next((s for s in self.pipeline if isinstance(s, ShardReader)), None)

    def _begin(self, book: ResumeBook) -> None:
        """Restore the epoch keys of the shard stages (their orders repeat from them); a
        spec's epoch is known before its first sample (a state taken then has it)."""
        first = self.pipeline[0]
        if isinstance(getattr(first, "epochs", None), EpochCounter):
            saved = int(book.get("epoch", -1))
            book.epoch = saved if saved >= 0 else first.epochs.peek(book.info.worker)
        if hasattr(first, "shape"):  # a spec's mix: where its weight schedules stand
            first.shape = self._epoch_shape(book)
        keys: dict[str, str] = {}
        for n, stage in enumerate(self.pipeline):
            epochs = getattr(stage, "_epochs", None)
            if epochs is None:
                continue
            saved = book.get(f"epochs.{n}")
            if saved:
                explicit, started = saved.split(",")
                epochs.explicit = None if explicit == "-" else int(explicit)
                epochs.started = int(started)
            name = f"epochs.{n}"
            keys[name] = f"{'-' if epochs.explicit is None else epochs.explicit},{epochs.started}"
            book.part(name, functools.partial(dict, ((name, keys[name]),)))
            if epochs.explicit is None and book.info.seed is not None:
                book.unsupported = ("a DataLoader worker's epochs are numbered only if the "
                                    "epoch is set: call dataset.set_epoch(e) (WebLoader does)")
        book.key = [int(x) for name in sorted(keys)
                    for x in keys[name].replace("-", "-1").split(",")]

    def _epoch_shape(self, book: ResumeBook) -> tuple[int | None, int | None]:
        """``(samples per epoch over all ranks, batch size)``, where known: the batch size of
        the pipeline's first ``batched``/``listed`` or of ``with_epoch(batch_size=B)``; the
        epoch's length from ``with_epoch``."""
        batch = next((int(kind.split(":")[1]) for kind in book.stages.split(",")
                      if kind.split(":")[0] in ("batched", "listed")
                      and kind.split(":")[1].isdigit()), None)
        info = book.info
        if self.rank_epoch is not None:
            units, multiple = self.rank_epoch
            batch = multiple if multiple > 1 else batch
            return units * (batch or 1) * info.world_size, batch
        if self.nsamples > 0:
            return self.nsamples * (batch or 1) * info.world_size * info.num_workers, batch
        return None, batch

    def _complete(self, book: ResumeBook) -> None:
        first = self.pipeline[0]
        saved = int(book.get("epoch", -1))
        if hasattr(first, "epochs") and saved >= 0:
            first.epochs.resume(book.info.worker, saved + 1)
        for n, stage in enumerate(self.pipeline):
            epochs = getattr(stage, "_epochs", None)
            if epochs is not None and book.get(f"epochs.{n}") is not None:
                epochs.started += 1

    def _adopt_seed(self, seed: int) -> None:
        self.seed = seed
        for stage in self.pipeline:
            if hasattr(stage, "seed") and isinstance(stage.seed, int) \
                    and not isinstance(stage, ShardReader):
                stage.seed = seed

    def __enter__(self) -> WebDataset:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class FluidWrapper(DataPipeline, FluidInterface):
    """A pipeline with the fluid methods, starting from ``initial`` (a source)."""

    def __init__(self, initial: Any) -> None:
        super().__init__()
        self.append(initial)

