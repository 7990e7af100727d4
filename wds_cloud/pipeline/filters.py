"""Pipeline stages, with webdataset 1.0's names, arguments and defaults.

Each public stage is curried with :func:`~wds_cloud.pipeline.pipelinefilter`:
``map(f)`` returns a picklable stage, and ``map(f)(samples)`` the mapped iterator. Options are
checked when the stage starts (when the pipeline is iterated), before the first sample.

Stages that take ``handler`` call it with any exception a sample raises: the handler re-raises,
returns ``True`` (skip the sample) or ``False`` (end the stage), see :mod:`wds_cloud.handlers`.
Randomness follows webdataset 1.0.2 draw for draw: ``shuffle`` and ``rsample`` take ``rng``
or ``seed``; without them ``shuffle`` seeds a fresh ``random.Random()`` from the OS (1.0.2
from the time and pid) and ``rsample`` draws from the global ``random``, as 1.0.2's does.
A sample that lacks a key a stage asks for raises
:class:`~wds_cloud.errors.ShardFormatError` naming the sample, the keys and the shard.

Key-based stages (``to_tuple``, ``rename``, ``rename_keys``, ``extract_keys``, ``xdecode``)
live in :mod:`wds_cloud.pipeline.keys`, batching stages in
:mod:`wds_cloud.pipeline.batching`, the sample caches (``Cached``, ``LMDBCached``) in
:mod:`wds_cloud.pipeline.samplecache`; all are re-exported here, so
``wds_cloud.pipeline.filters.batched`` works as in webdataset.
"""

from __future__ import annotations

import itertools
import random
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from numbers import Integral
from typing import IO, Any

from ..errors import ConfigError
from ..handlers import Handler, reraise_exception
from .batching import batched, combine_values, default_collation_fn, listed, unbatched, unlisted
from .core import PipelineStage, pipelinefilter
from .curried import FilterFunction, RestCurried, compose2, pipeline
from .keys import (
    decode_bin,
    decode_pickle,
    decode_text,
    default_decoders,
    dict2tuple,
    extract_keys,
    find_decoder,
    getfirst,
    identity,
    map_tuple,
    parse_field_spec,
    rename,
    rename_keys,
    to_tuple,
    transform_with,
    tuple2dict,
    xdecode,
)
from .samplecache import Cached, LMDBCached

__all__ = [
    "Cached",
    "FilterFunction",
    "LMDBCached",
    "RestCurried",
    "associate",
    "batched",
    "buffer_shuffle",
    "check_bufsize",
    "combine_values",
    "compose",
    "compose2",
    "decode",
    "decode_bin",
    "decode_pickle",
    "decode_text",
    "default_collation_fn",
    "default_decoders",
    "detshuffle",
    "dict2tuple",
    "extract_keys",
    "find_decoder",
    "getfirst",
    "identity",
    "info",
    "listed",
    "log_keys",
    "map",
    "map_dict",
    "map_tuple",
    "parse_field_spec",
    "pick",
    "pipeline",
    "pipelinefilter",
    "rename",
    "rename_keys",
    "rsample",
    "select",
    "shuffle",
    "slice",
    "to_tuple",
    "transform_with",
    "tuple2dict",
    "unbatched",
    "unlisted",
    "xdecode",
]

_END = object()


class _Composed:
    """Picklable left-to-right composition of functions."""

    def __init__(self, funcs: tuple[Callable[[Any], Any], ...]) -> None:
        self.funcs = funcs

    def __call__(self, x: Any) -> Any:
        for f in self.funcs:
            x = f(x)
        return x

    def __repr__(self) -> str:
        return f"compose{self.funcs!r}"


def compose(*args: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """Compose functions left to right: ``compose(f, g)(x) == g(f(x))``; picklable."""
    for f in args:
        if not callable(f):
            raise ConfigError(f"compose: {f!r} is not callable")
    return _Composed(args)


def _info(
    data: Iterable[Any], fmt: str | None = None, n: int = 3, every: int = -1, width: int = 50,
    stream: IO[str] | None = None, name: str = "",
) -> Iterator[Any]:
    out = sys.stderr if stream is None else stream
    for i, sample in enumerate(data):
        if i < n or (every > 0 and (i + 1) % every == 0):
            if fmt is not None:
                out.write(fmt.format(**sample) + "\n")
            else:
                lines = [f"--- {name}"]
                lines += [f"{k} {repr(v)[:width]}" for k, v in sample.items()]
                out.write("\n".join(lines) + "\n")
        yield sample


def _shuffle(
    data: Iterable[Any], bufsize: int = 1000, initial: int = 100,
    rng: random.Random | None = None, seed: int | str | bytes | None = None,
    handler: Handler | None = None,
) -> Iterator[Any]:
    """webdataset's buffer shuffle, draw for draw: for the same ``rng`` (or ``seed``) the same
    order as webdataset 1.0.2 (``pick`` with ``rng.randint``), so a seeded pipeline, a
    ``detshuffle`` or open_clip's ``detshuffle2`` keeps its order across the two libraries. A
    ``bufsize`` below 1 leaves the order alone, as there. ``handler`` is accepted for
    webdataset compatibility; a shuffle has nothing to handle."""
    if seed is not None and rng is not None:
        raise ConfigError("shuffle: pass either rng or seed, not both")
    if isinstance(bufsize, bool) or not isinstance(bufsize, Integral):
        raise ConfigError(f"shuffle: bufsize must be an integer, got {bufsize!r}")
    if bufsize < 1:
        return iter(data)
    bufsize = int(bufsize)
    return _picked(iter(data), bufsize, min(int(initial), bufsize), rng or random.Random(seed))


def _picked(it: Iterator[Any], bufsize: int, initial: int, rng: Any) -> Iterator[Any]:
    """webdataset 1.0.2's loop: two samples in for each one out while the buffer is short,
    each out by :func:`pick`."""
    buf: list[Any] = []
    for sample in it:
        buf.append(sample)
        if len(buf) < bufsize:
            extra = next(it, _END)
            if extra is not _END:
                buf.append(extra)
        if len(buf) >= initial:
            yield pick(buf, rng)
    while buf:
        yield pick(buf, rng)


def _shuffled(it: Iterator[Any], bufsize: int, initial: int, rng: Any) -> Iterator[Any]:
    """The buffer shuffle; ``rng`` has ``random()`` and ``shuffle(list)`` (a ``random.Random``
    or a :class:`~wds_cloud.pipeline.rng.KeyedRandom`)."""
    rand = rng.random
    buf: list[Any] = []
    for sample in it:
        if len(buf) < bufsize:
            # while the buffer grows, take two samples in for each one out
            buf.append(sample)
            if len(buf) < bufsize:
                extra = next(it, _END)
                if extra is not _END:
                    buf.append(extra)
            if len(buf) < initial:
                continue
            k = int(rand() * len(buf))
            buf[k], buf[-1] = buf[-1], buf[k]
            yield buf.pop()
        else:
            k = int(rand() * bufsize)
            out, buf[k] = buf[k], sample
            yield out
    rng.shuffle(buf)
    yield from buf


def check_bufsize(bufsize: object) -> int:
    """``bufsize`` if it is a positive int (not a bool), else a :class:`ConfigError`."""
    if isinstance(bufsize, bool) or not isinstance(bufsize, int) or bufsize < 1:
        raise ConfigError(f"shuffle: bufsize must be a positive integer, got {bufsize!r}")
    return bufsize


def pick(buf: list[Any], rng: Any) -> Any:
    """Remove a random item of ``buf`` (``rng.randint``) and return it; the last item takes
    its place (webdataset's shuffle-buffer step)."""
    k = rng.randint(0, len(buf) - 1)
    sample = buf[k]
    buf[k] = buf[-1]
    buf.pop()
    return sample


def buffer_shuffle(it: Iterable[Any], bufsize: int, initial: int, rng: Any) -> Iterator[Any]:
    """Shuffle ``it`` in a buffer of ``bufsize`` (first output after ``initial``) drawing from
    ``rng`` (anything with ``random()`` and ``shuffle(list)``)."""
    return _shuffled(iter(it), bufsize, min(initial, bufsize), rng)


class detshuffle(PipelineStage):
    """Shuffle reproducibly: epoch ``e`` uses ``random.Random(seed + e)``.

    The epoch counter starts at ``epoch + 1`` and goes up by one each time the stage runs; it is
    per process (each DataLoader worker counts its own epochs).
    """

    def __init__(
        self, bufsize: int = 1000, initial: int = 100, seed: int = 0, epoch: int = -1
    ) -> None:
        self.bufsize = bufsize
        self.initial = initial
        self.seed = seed
        self.epoch = epoch

    def run(self, src: Iterable[Any]) -> Iterator[Any]:
        """Shuffle ``src`` with this epoch's generator and advance the epoch."""
        self.epoch += 1
        return _shuffle(src, self.bufsize, self.initial, random.Random(self.seed + self.epoch))


def _select(data: Iterable[Any], predicate: Callable[[Any], Any]) -> Iterator[Any]:
    return filter(predicate, data)


def _log_keys(data: Iterable[Any], logfile: str | None = None) -> Iterator[Any]:
    if not logfile:
        yield from data
        return
    import fcntl

    with open(logfile, "a") as stream:
        for i, sample in enumerate(data):
            line = (
                f"{i}\t{sample.get('__worker__')}\t{sample.get('__rank__')}\t"
                f"{sample.get('__key__')}\n"
            )
            fcntl.flock(stream.fileno(), fcntl.LOCK_EX)
            try:
                stream.write(line)
                stream.flush()
            finally:
                fcntl.flock(stream.fileno(), fcntl.LOCK_UN)
            yield sample


def _apply(data: Iterable[Any], f: Callable[[Any], Any], handler: Handler) -> Iterator[Any]:
    for sample in data:
        try:
            result = f(sample)
        except Exception as exn:
            if handler(exn):
                continue
            break
        yield result


def _decode(
    data: Iterable[Any], *args: Any, handler: Handler = reraise_exception, **kw: Any
) -> Iterator[Any]:
    from ..codecs.decoder import make_decoder

    return _apply(data, make_decoder(*args, handler=handler, **kw), handler)


def _map(
    data: Iterable[Any], f: Callable[[Any], Any], handler: Handler = reraise_exception
) -> Iterator[Any]:
    def keep_key(sample: Any) -> Any:
        result = f(sample)
        if isinstance(result, dict) and isinstance(sample, dict):
            result["__key__"] = sample.get("__key__")
        return result

    return (result for result in _apply(data, keep_key, handler) if result is not None)


def _associate(
    data: Iterable[Any], associator: Callable[[str], Mapping[str, Any]] | Mapping[str, Any],
    **kw: Any,
) -> Iterator[Any]:
    if kw:
        raise ConfigError(f"associate: unexpected keyword argument(s) {sorted(kw)}")
    lookup = associator if callable(associator) else _getter(associator)
    for sample in data:
        sample.update(lookup(sample["__key__"]))
        yield sample


def _getter(mapping: Mapping[str, Any]) -> Callable[[str], Any]:
    def get(key: str) -> Any:
        return mapping.get(key, {})

    return get


def _map_dict(
    data: Iterable[Any], handler: Handler = reraise_exception, **kw: Callable[[Any], Any]
) -> Iterator[Any]:
    if not kw:
        raise ConfigError("map_dict: give at least one field=function")
    for key, f in kw.items():
        if not callable(f):
            raise ConfigError(f"map_dict: the function for {key!r} is not callable: {f!r}")
    items = tuple(kw.items())
    for sample in data:
        try:
            for k, f in items:
                sample[k] = f(sample[k])
        except Exception as exn:
            if handler(exn):
                continue
            break
        yield sample


def _rsample(
    data: Iterable[Any], p: float = 0.5, *, rng: random.Random | None = None,
    seed: int | str | bytes | None = None,
) -> Iterator[Any]:
    if not 0.0 <= p <= 1.0:
        raise ConfigError(f"rsample: p must be a probability in [0, 1], got {p!r}")
    if seed is not None and rng is not None:
        raise ConfigError("rsample: pass either rng or seed, not both")
    if rng is None and seed is not None:
        rng = random.Random(seed)
    # unseeded, the global ``random`` (as webdataset's ``random.uniform(0, 1)``, the same draws)
    rand = rng.random if rng is not None else random.random
    return (sample for sample in data if rand() < p)


info = pipelinefilter(_info)
"""``info(fmt=None, n=3, every=-1, width=50, stream=sys.stderr, name="")``: describe samples."""
shuffle = pipelinefilter(_shuffle)
"""``shuffle(bufsize=1000, initial=100, rng=None, seed=None, handler=None)``: buffer shuffle."""
select = pipelinefilter(_select)
"""``select(predicate)``: keep the samples for which ``predicate(sample)`` is true."""
log_keys = pipelinefilter(_log_keys)
"""``log_keys(logfile=None)``: append ``index worker rank key`` lines to ``logfile``."""
_decode_stage = pipelinefilter(_decode)


def decode(*args: Any, **kw: Any) -> Any:
    """``decode(*handlers, handler=reraise_exception, **kw)``: ``autodecode.make_decoder``'s
    decoder. An image spec string it does not know is a :class:`ConfigError` here, where the
    pipeline is built (as in webdataset), not when the first sample is decoded (in a DataLoader
    worker)."""
    specs = [arg for arg in args if isinstance(arg, str)]
    if specs:
        from ..codecs.images import ImageHandler

        for spec in specs:
            ImageHandler(spec)
    return _decode_stage(*args, **kw)
map = pipelinefilter(_map)
"""``map(f, handler=reraise_exception)``: ``f(sample)``; ``None`` results are dropped."""
associate = pipelinefilter(_associate)
"""``associate(associator)``: merge ``associator(key)`` (or ``associator.get(key)``) in."""
map_dict = pipelinefilter(_map_dict)
"""``map_dict(handler=reraise_exception, **field_fns)``: ``sample[k] = f(sample[k])``."""
rsample = pipelinefilter(_rsample)
"""``rsample(p=0.5, *, rng=None, seed=None)``: keep each sample with probability ``p``."""
slice = pipelinefilter(itertools.islice)
"""``slice(stop)`` / ``slice(start, stop[, step])``: ``itertools.islice`` of the stream."""
