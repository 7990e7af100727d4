"""wds_cloud: stream WebDataset shards from local disk and object stores into PyTorch.

``import wds_cloud as wds`` runs code written for ``webdataset`` 1.0. Importing the package is
cheap and has no side effects: each public name is loaded from its module on first use, and
torch or fsspec are imported only when something needs them.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> module that defines it (relative to this package)
_EXPORTS: dict[str, str] = {
    # errors
    "AccessDeniedError": "errors",
    "CacheError": "errors",
    "CacheValidationError": "errors",
    "ConfigError": "errors",
    "MissingDependencyError": "errors",
    "OpenError": "errors",
    "PipeError": "errors",
    "ShardFormatError": "errors",
    "ShardNotFoundError": "errors",
    "SpecError": "errors",
    "TransferError": "errors",
    "UnsafeURLError": "errors",
    "UnsupportedSchemeError": "errors",
    "WdsCloudError": "errors",
    # settings, urls
    "Settings": "settings",
    "expand_urls": "urls",
    # I/O
    "Opener": "openers",
    "register_opener": "openers",
    "registered_schemes": "openers",
    "gopen": "router",
    "ShardCache": "cache",
    "io_stats": "remote",
    "reset_io_stats": "remote",
    "gopen_schemes": "router",
    # handlers
    "ignore_and_continue": "handlers",
    "ignore_and_stop": "handlers",
    "reraise_exception": "handlers",
    "warn_and_continue": "handlers",
    "warn_and_stop": "handlers",
    # decoding
    "Continue": "autodecode",
    "Decoder": "autodecode",
    "DecodingError": "errors",
    "gzfilter": "autodecode",
    "handle_extension": "autodecode",
    "imagehandler": "autodecode",
    "pytorch_weights_only": "autodecode",
    "torch_audio": "autodecode",
    "torch_loads": "autodecode",
    "torch_video": "autodecode",
    # pipeline and stages
    "DataPipeline": "pytorch",
    "MockDataset": "pipeline",
    "PipelineStage": "pipeline",
    "pipelinefilter": "pipeline",
    "repeatedly": "pipeline",
    "stage": "pipeline",
    "with_epoch": "pipeline",
    "with_length": "pipeline",
    "Cached": "filters",
    "associate": "filters",
    "batched": "filters",
    "compose": "filters",
    "decode": "filters",
    "detshuffle": "filters",
    "extract_keys": "filters",
    "getfirst": "filters",
    "info": "filters",
    "listed": "filters",
    "map": "filters",
    "map_dict": "filters",
    "map_tuple": "filters",
    "rename": "filters",
    "rename_keys": "filters",
    "rsample": "filters",
    "select": "filters",
    "shuffle": "filters",
    "slice": "filters",
    "to_tuple": "filters",
    "transform_with": "filters",
    "unbatched": "filters",
    "unlisted": "filters",
    "xdecode": "filters",
    "RandomMix": "mix",
    "RoundRobin": "mix",
    # shards
    "WorkerInfo": "shards",
    "derive_seed": "shards",
    "SimpleShardList": "shards",
    "non_empty": "shards",
    "shardspec": "shards",
    "ResampledShards": "pytorch",
    "resampled": "pytorch",
    "single_node_only": "pytorch",
    "split_by_node": "pytorch",
    "split_by_worker": "pytorch",
    "worker_info": "pytorch",
    # samples from tar, cbor and msgpack files
    "tarfile_samples": "compat",
    "tarfile_to_samples": "compat",
    "url_opener": "compat",
    "cbors_to_samples": "compat",
    "msgpacks_to_samples": "compat",
    # writing
    "EncodingError": "errors",
    "ShardWriter": "writer",
    "TarWriter": "writer",
    "numpy_dumps": "writer",
    "torch_dumps": "writer",
    # integration
    "FluidInterface": "compat",
    "FluidWrapper": "compat",
    "WebDataset": "compat",
    "WebLoader": "pytorch",
}

# webdataset's module names, so ``wds.autodecode.ImageHandler`` style code keeps working.
# (No module may share a name with a public function: importing it would shadow the function.)
_MODULE_ALIASES: dict[str, str] = {
    "autodecode": "autodecode",
    "filters": "filters",
    "handlers": "handlers",
    "mix": "mix",
    "shardlists": "pytorch",
    "tariterators": "compat",
    "tenbin": "tenbin",
    "urls": "urls",
    "writer": "writer",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is not None:
        value = getattr(importlib.import_module(f".{module}", __name__), name)
        globals()[name] = value
        return value
    alias = _MODULE_ALIASES.get(name)
    if alias is not None:
        return importlib.import_module(f".{alias}", __name__)
    raise AttributeError(f"module 'wds_cloud' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS) | set(_MODULE_ALIASES))
