"""Transforming many shards in parallel: read a shard, transform its samples, write a shard.

webdataset's offline augmentation, one task per shard on any executor::

    def augment(sample):                 # at the top level of a module: tasks pickle it
        sample["jpg"] = flip(sample["jpg"])
        return sample

    wds.map_shards(augment, "s3://b/train-{000000..000099}.tar", "s3://b/flipped-%06d.tar",
                   executor=dask_client, decode="pil")

Each shard is read with :func:`wds_cloud.tarfile_samples` (through the router: rewrite rules,
AIStore; no shard cache, each shard is read once) and written with
:class:`~wds_cloud.TarWriter` (reproducible bytes, atomic: a failed shard leaves no output, not
even a partial one).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

from ..errors import ConfigError, ShardNotFoundError
from ..settings import Settings
from ..urls import expand_urls, redact, split_scheme
from .create import shard_names, tar_file_size
from .executors import (
    check_picklable,
    for_executor,
    run_tasks,
    task_settings,
    where_workers_see,
)
from .report import RunReport, ShardDone, ShardReport, shard_callback

__all__ = ["map_shard", "map_shards", "output_urls"]

Sample = dict[str, Any]
SampleFn = Callable[[Sample], "Sample | Iterable[Sample] | None"]


@dataclass(frozen=True)
class _MapJob:
    fn: Callable[..., Any]
    input: str
    output: str
    decode: Any
    encoder: Any
    whole_shard: bool
    storage_options: dict[str, Any]
    settings: Settings


def map_shards(
    fn: Callable[..., Any], inputs: str | Sequence[str],
    outputs: str | Sequence[str] | Callable[[str], str], *, executor: Any = None,
    retries: int = 2, decode: Any = False, encoder: Any = True, whole_shard: bool = False,
    storage_options: dict[str, Any] | None = None, settings: Settings | None = None,
    on_shard: Callable[[ShardReport], None] | None = None,
) -> RunReport:
    """Run ``fn`` over the samples of each shard of ``inputs``, writing shard ``outputs[i]``
    from shard ``inputs[i]``, one task per shard on ``executor``.

    ``fn(sample) -> sample | None | iterable of samples``: a returned dict without a
    ``__key__`` keeps the input's; None drops the sample; an iterable gives any number of
    samples (each with its own ``__key__``). With ``whole_shard=True``, ``fn(samples)`` gets
    the iterator of a shard's samples and returns an iterable of samples (to drop, merge or
    reorder across samples). ``fn`` must be picklable for a process pool (a function at the
    top level of a module, or a ``functools.partial`` of one); Dask also takes lambdas.

    ``inputs``: shard URLs, or a string with brace patterns, ``::`` lists and globs.
    ``outputs``: a ``%d`` pattern (``"out/aug-%06d.tar"``: numbered in input order), a list
    or brace pattern of as many URLs, or a function ``input URL -> output URL``; outputs must
    be distinct and never an input. ``decode``: False (fields are bytes), True (webdataset's
    basic decoders: json, txt, cls, npy...), an image spec such as ``"pil"``/``"rgb8"``, or
    a list of specs and handlers (what ``.decode(...)`` takes). ``encoder``: TarWriter's
    (True: by extension, so decoded values are encoded back). ``storage_options`` are used
    to read and to write.

    ``executor``: None (this process, one shard after the other), a
    ``concurrent.futures`` thread or process pool, or a Dask ``distributed.Client``. A
    failed shard is tried ``retries`` more times. Returns the :class:`RunReport` (samples
    in and out per shard, retried shards); raises
    :class:`~wds_cloud.errors.ShardTaskError` naming every shard that failed after its
    retries, once all the others are written.
    """
    started = time.perf_counter()
    for what, value in (("the function", fn), ("decode", decode), ("encoder", encoder)):
        check_picklable(value, executor, what)
    settings = task_settings(settings)
    options = dict(storage_options or {})
    sources = input_urls(inputs, options, settings)
    targets = output_urls(outputs, sources)
    for target in targets:
        if not split_scheme(target)[0]:
            os.makedirs(os.path.dirname(os.path.abspath(target)), exist_ok=True)
    pairs = list(zip(sources, targets, strict=True))
    call = for_executor(fn, executor)
    jobs = [(source, _MapJob(call, where_workers_see(source), where_workers_see(target),
                             decode, encoder, whole_shard, options, settings))
            for source, target in pairs]
    callback = shard_callback(on_shard, {s: (t, s) for s, t in pairs})
    outcomes = run_tasks(map_shard, jobs, executor=executor, retries=retries,
                         on_outcome=callback)
    shards = [ShardReport.of(t, s, o) for s, t, o in zip(sources, targets, outcomes, strict=True)]
    return RunReport(shards, time.perf_counter() - started).raise_for_failures()


def input_urls(inputs: str | Sequence[str], options: dict[str, Any],
               settings: Settings) -> list[str]:
    """The shard URLs ``inputs`` names (brace patterns, ``::`` lists, globs listed now); a
    local file that does not exist is a :class:`ShardNotFoundError` before anything runs."""
    from ..router import expand_glob

    if not isinstance(inputs, str) and not all(isinstance(u, str) for u in inputs):
        raise ConfigError(f"inputs must be shard URLs (strings), got {inputs!r}")
    urls = expand_glob(expand_urls(inputs, url_vars=settings.url_vars), settings=settings,
                       storage_options=options)
    if not urls:
        raise ConfigError(f"inputs {inputs!r} name no shards")
    missing = [u for u in urls if not split_scheme(u)[0] and u != "-" and not os.path.exists(u)]
    if missing:
        raise ShardNotFoundError(f"no such file: {', '.join(map(repr, missing[:5]))}"
                                 + (f" and {len(missing) - 5} more" if len(missing) > 5 else ""),
                                 url=missing[0])
    return urls


def output_urls(outputs: str | Sequence[str] | Callable[[str], str],
                inputs: Sequence[str]) -> list[str]:
    """One output URL per input (see :func:`map_shards`), checked: distinct, none an input."""
    if callable(outputs):
        targets = [str(outputs(url)) for url in inputs]
    elif isinstance(outputs, str) and "%" in outputs:
        targets = shard_names(outputs, len(inputs))
    else:
        targets = expand_urls(outputs)
    if len(targets) != len(inputs):
        raise ConfigError(f"{_count(len(inputs), 'input shard')} but "
                          f"{_count(len(targets), 'output')}; give as many outputs, or a "
                          "pattern with a %d field such as 'out/aug-%06d.tar'")
    if len(set(targets)) != len(targets):
        raise ConfigError("two input shards would be written to the same output; outputs must "
                          f"be distinct (got {[redact(t) for t in targets[:5]]}...)")
    same = sorted(set(targets) & set(inputs))
    if same:
        raise ConfigError(f"output {redact(same[0])!r} is also an input; write to other names "
                          "(a retried shard must read its input unchanged)")
    return targets


def _count(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def map_shard(job: _MapJob) -> ShardDone:
    """One task: read ``job.input``, transform, write ``job.output`` (atomically)."""
    from ..dataset import tarfile_samples
    from ..handlers import reraise_exception
    from ..tar.writer import TarWriter

    read = [0]
    raw = tarfile_samples([{"url": job.input}], reraise_exception,
                          storage_options=job.storage_options, settings=job.settings)
    with contextlib.closing(cast(Generator[Sample, None, None], raw)), TarWriter(
            job.output, encoder=job.encoder, storage_options=job.storage_options,
            settings=job.settings) as sink:
        samples = _counted(_decoded(raw, job.decode, job.settings), read)
        results = job.fn(samples) if job.whole_shard else _per_sample(job.fn, samples)
        written = 0
        for sample in results:
            sink.write(sample)
            written += 1
        members = sink.offset
    return ShardDone(job.output, written, tar_file_size(members), read[0])


def _counted(samples: Iterable[Sample], read: list[int]) -> Iterator[Sample]:
    for sample in samples:
        read[0] += 1
        yield sample


def _decoded(samples: Iterable[Sample], decode: Any, settings: Settings) -> Iterable[Sample]:
    if decode is False or decode is None:
        return samples
    from ..codecs.decoder import make_decoder

    if decode is True:
        specs: Sequence[Any] = ()
    elif isinstance(decode, (list, tuple)):
        specs = decode
    else:
        specs = (decode,)
    decoder = make_decoder(*specs, secure=settings.secure,
                           weights_only=settings.pytorch_weights_only)
    return map(decoder, samples)


def _per_sample(fn: Callable[[Sample], Any], samples: Iterable[Sample]) -> Iterator[Sample]:
    for sample in samples:
        result = fn(sample)
        if result is None:
            continue
        if isinstance(result, dict):
            result.setdefault("__key__", sample.get("__key__"))
            yield result
        else:
            yield from result
