"""webdataset's module path ``webdataset.compat``: ``WebDataset``, ``FluidInterface``,
``FluidWrapper``, ``WebLoader`` and ``DataPipeline``, with the helpers webdataset's module
imported (``check_empty``, ``group_by_keys``, ``tar_file_expander``, ``pipelinefilter``,
``reraise_exception``), under that one name.

A module of re-exports, not an alias: webdataset kept these together, here ``WebDataset``
lives in :mod:`wds_cloud.dataset` (the composition root) and ``WebLoader`` in
:mod:`wds_cloud.pytorch` (the only module that imports torch). It has no flags to patch.
"""

from collections.abc import Iterable, Iterator
from typing import Any

from . import dataset
from .dataset import FluidInterface, FluidWrapper, WebDataset, group_by_keys, tar_file_expander
from .handlers import reraise_exception
from .pipeline.core import pipelinefilter
from .pytorch import DataPipeline, WebLoader

__all__ = [
    "DataPipeline",
    "FluidInterface",
    "FluidWrapper",
    "WebDataset",
    "WebLoader",
    "check_empty",
    "group_by_keys",
    "pipelinefilter",
    "reraise_exception",
    "tar_file_expander",
]


def check_empty(source: Iterable[Any]) -> Iterator[Any]:
    """webdataset's ``compat.check_empty(source)``: ``source``'s samples; if there are none,
    :class:`~wds_cloud.errors.ConfigError` (a ``ValueError``, as webdataset's) saying where.
    (The ``WebDataset``'s own stage is :class:`wds_cloud.dataset.check_empty`.)"""
    return dataset.check_empty()(source)
