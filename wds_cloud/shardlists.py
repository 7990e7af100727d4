"""webdataset's module path ``webdataset.shardlists``: its shard lists, node and worker
splitting, resampling and ``MultiShardSample``, under that one name.

A module of re-exports, not an alias: webdataset kept these together, here they live in their
rooms (the shard lists in :mod:`wds_cloud.pipeline`, what asks torch where it runs in
:mod:`wds_cloud.pytorch`, spec-reading ``MultiShardSample`` and its environment helpers in
:mod:`wds_cloud.specdataset`, URL expansion in :mod:`wds_cloud.urls`). It has no flags to
patch. ``ResampledShardList`` is webdataset's second name for ``ResampledShards``.
"""

from .pipeline.core import pipelinefilter
from .pipeline.directory import DirectoryShardList
from .pipeline.shardnames import check_pid_is_running, get_pid_from_filename, without_last_extension
from .pipeline.shards import expand_source
from .pipeline.shards import resample_items as resampled_
from .pytorch import (
    ResampledShards,
    SimpleShardList,
    non_empty,
    resampled,
    shardspec,
    single_node_only,
    split_by_node,
    split_by_worker,
)
from .specdataset import MSSource, MultiShardSample, default_rng, envlookup, envsubst, expand
from .urls import expand_urls
from .utils import is_iterable, obsolete

ResampledShardList = ResampledShards

__all__ = [
    "DirectoryShardList",
    "MSSource",
    "MultiShardSample",
    "ResampledShardList",
    "ResampledShards",
    "SimpleShardList",
    "check_pid_is_running",
    "default_rng",
    "envlookup",
    "envsubst",
    "expand",
    "expand_source",
    "expand_urls",
    "get_pid_from_filename",
    "is_iterable",
    "non_empty",
    "obsolete",
    "pipelinefilter",
    "resampled",
    "resampled_",
    "shardspec",
    "single_node_only",
    "split_by_node",
    "split_by_worker",
    "without_last_extension",
]
