"""L2 DataPipeline and its stages: filters, batching, keys, mixing, shard lists and node/worker
splitting, the fluid interface.
"""

from __future__ import annotations

from .batching import (
    batched,
    combine_values,
    default_collation_fn,
    listed,
    unbatched,
    unlisted,
)
from .core import (
    MockDataset,
    Pipeline,
    PipelineStage,
    pipelinefilter,
    repeatedly,
    stage,
    with_epoch,
    with_length,
)
from .directory import DirectoryShardList
from .epochs import EpochCounter
from .exact import ExactEpochShards
from .filters import (
    Cached,
    LMDBCached,
    associate,
    compose,
    decode,
    detshuffle,
    extract_keys,
    getfirst,
    identity,
    info,
    log_keys,
    map,
    map_dict,
    map_tuple,
    rename,
    rename_keys,
    rsample,
    select,
    shuffle,
    slice,
    to_tuple,
    transform_with,
    xdecode,
)
from .fluid import FluidInterface
from .keys import (
    decode_bin,
    decode_pickle,
    decode_text,
    default_decoders,
    find_decoder,
)
from .mix import (
    RandomMix,
    RoundRobin,
    random_samples,
    round_robin_longest,
    round_robin_shortest,
)
from .shards import (
    ShardResampler,
    ShardShuffle,
    SimpleShardList,
    WorkerInfo,
    WorkerInfoSource,
    derive_seed,
    expand_source,
    node_share,
    non_empty,
    require_single_node,
    resample_items,
    resolve_worker_info,
    shardspec,
    worker_share,
)

__all__ = [
    "Cached",
    "DirectoryShardList",
    "EpochCounter",
    "ExactEpochShards",
    "FluidInterface",
    "LMDBCached",
    "MockDataset",
    "Pipeline",
    "PipelineStage",
    "RandomMix",
    "RoundRobin",
    "ShardResampler",
    "ShardShuffle",
    "SimpleShardList",
    "WorkerInfo",
    "WorkerInfoSource",
    "associate",
    "batched",
    "combine_values",
    "compose",
    "decode",
    "decode_bin",
    "decode_pickle",
    "decode_text",
    "default_collation_fn",
    "default_decoders",
    "derive_seed",
    "detshuffle",
    "expand_source",
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
    "node_share",
    "non_empty",
    "pipelinefilter",
    "random_samples",
    "rename",
    "rename_keys",
    "repeatedly",
    "require_single_node",
    "resample_items",
    "resolve_worker_info",
    "round_robin_longest",
    "round_robin_shortest",
    "rsample",
    "select",
    "shardspec",
    "shuffle",
    "slice",
    "stage",
    "to_tuple",
    "transform_with",
    "unbatched",
    "unlisted",
    "with_epoch",
    "with_length",
    "worker_share",
    "xdecode",
]


#: webdataset's ``webdataset.pipeline`` names that live a layer up (the torch-aware
#: ``DataPipeline`` and ``add_length_method``): looked up only when asked for, so importing
#: this package stays torch-free
_ABOVE = {"DataPipeline": "pytorch", "add_length_method": "torch_datasets"}


def __getattr__(name: str) -> object:
    module = _ABOVE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"..{module}", __name__), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_ABOVE))
