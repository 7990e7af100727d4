"""webdataset's module path ``webdataset.compat``: ``WebDataset``, ``FluidInterface``,
``FluidWrapper``, ``WebLoader`` and ``DataPipeline``, under that one name.

A module of re-exports, not an alias: webdataset kept these together, here ``WebDataset``
lives in :mod:`wds_cloud.dataset` (the composition root) and ``WebLoader`` in
:mod:`wds_cloud.pytorch` (the only module that imports torch). It has no flags to patch.
"""

from .dataset import FluidInterface, FluidWrapper, WebDataset
from .pytorch import DataPipeline, WebLoader

__all__ = ["DataPipeline", "FluidInterface", "FluidWrapper", "WebDataset", "WebLoader"]
