"""Batching stages and webdataset's default collation.

``batched`` groups samples into lists and collates them: dict samples become a dict of columns,
tuple (or list) samples a tuple of columns. A column of ints/floats (and numpy scalars) becomes a
numpy array, a column of numpy arrays is stacked, a column of torch tensors is stacked with
torch, anything else stays a list. torch is never imported here, and numpy only to collate
numbers: a value is a tensor (or a numpy value) only if whoever made it imported torch (numpy).

Differences from webdataset 1.0.2, on purpose: dict batches keep the key order of the first
sample (webdataset's order is a set's), numpy scalar columns are stacked into arrays (webdataset
stacks ``np.float64`` but leaves ``np.int64`` in a list), and mismatched samples raise
:class:`~wds_cloud.errors.ShardFormatError` naming the field instead of an ``assert``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import islice
from numbers import Integral
from typing import Any

from ..errors import ConfigError, ShardFormatError
from .core import pipelinefilter

__all__ = [
    "batched",
    "combine_values",
    "default_collation_fn",
    "listed",
    "unbatched",
    "unlisted",
]

def _same_shapes(values: Sequence[Any], field: object) -> None:
    shapes = {tuple(v.shape) for v in values}
    if len(shapes) > 1:
        raise ShardFormatError(
            f"batched: cannot stack field {field!r}: its arrays have different shapes "
            f"{sorted(shapes)}; make them one shape in a map() stage before batching, or "
            f"batch with collation_fn=None"
        )


def combine_values(
    b: Sequence[Any], combine_tensors: bool = True, combine_scalars: bool = True, *,
    field: object = None,
) -> Any:
    """Collate one column of a batch (see the module docstring); ``field`` names it in errors."""
    first = b[0]
    numpy = sys.modules.get("numpy")
    if isinstance(first, (int, float)) or (
            numpy is not None and isinstance(first, (numpy.number, numpy.bool_))):
        if not combine_scalars:
            return list(b)
        import numpy as np

        return np.array(b)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(first, torch.Tensor):
        if not combine_tensors:
            return list(b)
        _same_shapes(b, field)
        return torch.stack(list(b))
    if numpy is not None and isinstance(first, numpy.ndarray):
        if not combine_tensors:
            return list(b)
        _same_shapes(b, field)
        return numpy.stack(b)
    return list(b)


def default_collation_fn(
    samples: Sequence[Any], combine_tensors: bool = True, combine_scalars: bool = True
) -> Any:
    """Collate a list of samples (dicts, tuples or lists) into one batch; see the module doc."""
    if not samples:
        raise ConfigError("default_collation_fn: cannot collate an empty list of samples")
    first = samples[0]
    if isinstance(first, dict):
        keys = first.keys()
        for sample in samples:
            if sample.keys() != keys:
                raise ShardFormatError(
                    f"batched: samples have different keys, {sorted(map(str, keys))} and "
                    f"{sorted(map(str, sample.keys()))}; select the same fields in every "
                    f"sample (e.g. with to_tuple or rename_keys) before batching",
                    url=first.get("__url__"),
                )
        return {
            k: combine_values([s[k] for s in samples], combine_tensors, combine_scalars, field=k)
            for k in keys
        }
    if isinstance(first, (list, tuple)):
        width = len(first)
        for sample in samples:
            if len(sample) != width:
                raise ShardFormatError(
                    f"batched: tuple samples have different lengths ({width} and "
                    f"{len(sample)}); every sample must have the same fields"
                )
        return tuple(
            combine_values(column, combine_tensors, combine_scalars, field=i)
            for i, column in enumerate(zip(*samples, strict=False))
        )
    return combine_values(samples, combine_tensors, combine_scalars)


def _batched(
    data: Iterable[Any],
    batchsize: int = 20,
    collation_fn: Callable[[list[Any]], Any] | None = default_collation_fn,
    partial: bool = True,
) -> Iterator[Any]:
    if not isinstance(batchsize, Integral) or batchsize < 1:
        raise ConfigError(f"batched: batchsize must be a positive integer, got {batchsize!r}")
    return _batches(iter(data), int(batchsize), collation_fn, partial)


def _batches(
    it: Iterator[Any], batchsize: int, collation_fn: Callable[[list[Any]], Any] | None,
    partial: bool,
) -> Iterator[Any]:
    while True:
        batch = list(islice(it, batchsize))
        if not batch or (len(batch) < batchsize and not partial):
            return
        yield batch if collation_fn is None else collation_fn(batch)


def _listed(data: Iterable[Any], batchsize: int = 20, partial: bool = True) -> Iterator[Any]:
    return _batched(data, batchsize, None, partial)


def _unlisted(data: Iterable[Any]) -> Iterator[Any]:
    for batch in data:
        if not isinstance(batch, list):
            raise ConfigError(
                f"unlisted: expected each item to be a list of samples (made by listed()), "
                f"got {type(batch).__name__}"
            )
        yield from batch


def _columns_length(columns: Iterable[Any], what: str) -> int:
    lengths = {len(c) for c in columns}
    if len(lengths) != 1:
        raise ShardFormatError(
            f"unbatched: the columns of a {what} batch have different lengths "
            f"{sorted(lengths)}; cannot split it into samples"
        )
    return lengths.pop()


def _unbatched(data: Iterable[Any]) -> Iterator[Any]:
    for batch in data:
        if isinstance(batch, (list, tuple)):
            _columns_length(batch, "tuple")
            yield from zip(*batch, strict=False)
        elif isinstance(batch, dict):
            _columns_length(batch.values(), "dict")
            keys = tuple(batch.keys())
            for values in zip(*batch.values(), strict=False):
                yield dict(zip(keys, values, strict=False))
        else:
            raise ConfigError(
                f"unbatched: expected a batch (a tuple/list of columns or a dict of columns), "
                f"got {type(batch).__name__}"
            )


batched = pipelinefilter(_batched)
"""``batched(batchsize=20, collation_fn=default_collation_fn, partial=True)``: collated batches;
``partial=False`` drops a short last batch; ``collation_fn=None`` yields plain lists."""
listed = pipelinefilter(_listed)
"""``listed(batchsize=20, partial=True)``: lists of ``batchsize`` samples, uncollated."""
unlisted = pipelinefilter(_unlisted)
"""``unlisted()``: the samples of each list, in order (inverse of ``listed``)."""
unbatched = pipelinefilter(_unbatched)
"""``unbatched()``: the samples of each collated batch (inverse of ``batched``)."""
