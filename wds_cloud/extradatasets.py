"""webdataset's module path ``webdataset.extradatasets``: ``MockDataset``, ``with_epoch``,
``with_length``, ``PipelineStage`` and the stage class ``repeatedly``, under that one name.

A module of re-exports, not an alias of :mod:`wds_cloud.pipeline.core`: there, as at the top
level (``wds.repeatedly``, webdataset's ``utils.repeatedly``), ``repeatedly`` is the generator
function; webdataset's ``extradatasets.repeatedly`` is a stage class, which is
:class:`~wds_cloud.pipeline.curried.RepeatedStage` here. It has no flags to patch.
"""

from .pipeline.core import MockDataset, PipelineStage, with_epoch, with_length
from .pipeline.curried import RepeatedStage

repeatedly = RepeatedStage

__all__ = ["MockDataset", "PipelineStage", "repeatedly", "with_epoch", "with_length"]
