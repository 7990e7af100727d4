"""wds_cloud: stream WebDataset shards from local disk and object stores into PyTorch.

``import wds_cloud as wds`` runs code written for ``webdataset`` 1.0. Importing the package is
cheap and has no side effects: each public name is loaded from its module on first use, and
torch or fsspec are imported only when something needs them.
"""

from __future__ import annotations

import importlib
import sys
import types
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
    "ResumeError": "errors",
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
    "Opener": "io",
    "register_opener": "io",
    "registered_schemes": "io",
    "gopen": "router",
    "ShardCache": "cache",
    "LRUCleanup": "cache",
    "pipe_cleaner": "cache",
    "io_stats": "stores",
    "merge_state_dicts": "pipeline.slots",
    "reset_io_stats": "stores",
    "gopen_schemes": "router",
    "rewrite_url": "router",
    # handlers
    "ignore_and_continue": "handlers",
    "ignore_and_stop": "handlers",
    "reraise_exception": "handlers",
    "warn_and_continue": "handlers",
    "warn_and_stop": "handlers",
    # decoding
    "Continue": "codecs.decoder",
    "Decoder": "codecs.decoder",
    "DecodingError": "errors",
    "gzfilter": "codecs.decoder",
    "handle_extension": "codecs.decoder",
    "imagehandler": "codecs.decoder",
    "pytorch_weights_only": "codecs.decoder",
    "torch_audio": "codecs.decoder",
    "torch_loads": "codecs.decoder",
    "torch_video": "codecs.decoder",
    # pipeline and stages
    "DataPipeline": "pytorch",
    "MockDataset": "pipeline.core",
    "PipelineStage": "pipeline.core",
    "pipelinefilter": "pipeline.core",
    "repeatedly": "pipeline.core",
    "stage": "pipeline.core",
    "with_epoch": "pipeline.core",
    "with_length": "pipeline.core",
    "Cached": "pipeline.filters",
    "LMDBCached": "pipeline.filters",
    "associate": "pipeline.filters",
    "batched": "pipeline.filters",
    "compose": "pipeline.filters",
    "decode": "pipeline.filters",
    "detshuffle": "pipeline.filters",
    "extract_keys": "pipeline.filters",
    "getfirst": "pipeline.filters",
    "info": "pipeline.filters",
    "listed": "pipeline.filters",
    "map": "pipeline.filters",
    "map_dict": "pipeline.filters",
    "map_tuple": "pipeline.filters",
    "rename": "pipeline.filters",
    "rename_keys": "pipeline.filters",
    "rsample": "pipeline.filters",
    "select": "pipeline.filters",
    "shuffle": "pipeline.filters",
    "slice": "pipeline.filters",
    "to_tuple": "pipeline.filters",
    "transform_with": "pipeline.filters",
    "unbatched": "pipeline.filters",
    "unlisted": "pipeline.filters",
    "xdecode": "pipeline.filters",
    "RandomMix": "pipeline.mix",
    "RoundRobin": "pipeline.mix",
    # shards
    "WorkerInfo": "pipeline.shards",
    "derive_seed": "pipeline.shards",
    "SimpleShardList": "pipeline.shards",
    "DirectoryShardList": "pipeline.directory",
    "ExactEpochShards": "pipeline.exact",
    "MultiShardSample": "specdataset",
    # dataset specs
    "DatasetSpec": "spec",
    "SourceSpec": "spec",
    "load_spec": "spec",
    "non_empty": "pipeline.shards",
    "shardspec": "pipeline.shards",
    "ResampledShards": "pytorch",
    "resampled": "pytorch",
    "single_node_only": "pytorch",
    "split_by_node": "pytorch",
    "split_by_worker": "pytorch",
    "worker_info": "pytorch",
    # samples from tar, cbor and msgpack files
    "tarfile_samples": "dataset",
    "tarfile_to_samples": "dataset",
    "url_opener": "dataset",
    "cbors_to_samples": "dataset",
    "msgpacks_to_samples": "dataset",
    # writing
    "EncodingError": "errors",
    "ShardWriter": "tar.writer",
    "TarWriter": "tar.writer",
    "numpy_dumps": "tar.writer",
    "torch_dumps": "tar.writer",
    # per-shard tasks in parallel (this process, concurrent.futures or Dask)
    "create_shards": "parallel",
    "map_shards": "parallel",
    # integration
    "FluidInterface": "dataset",
    "FluidWrapper": "dataset",
    "WebDataset": "dataset",
    "WebLoader": "pytorch",
}

# webdataset's module paths: ``import wds_cloud.autodecode`` (or ``wds.autodecode``) gives the
# module that holds the code (each alias file puts it in ``sys.modules``), so patching a module
# flag such as ``wds.autodecode.pytorch_weights_only`` reaches the code that reads it.
# (No module may share a name with a public function: importing it would shadow the function;
# ``gopen`` is the one exception, as in webdataset, see ``_Package``.)
_MODULE_ALIASES: dict[str, str] = {
    "autodecode": "codecs.decoder",
    "compat": "compat",
    "extradatasets": "extradatasets",
    "filters": "pipeline.filters",
    "mix": "pipeline.mix",
    "shardlists": "shardlists",
    "tariterators": "dataset",
    "tenbin": "codecs.tenbin",
    "utils": "utils",
    "writer": "writer",
}
#: the public classes that webdataset 1.0 makes ``torch.utils.data.IterableDataset``
#: subclasses: looking one up calls :func:`wds_cloud.torch_datasets.register_torch_datasets` (which
#: never imports torch), so a shard list alone is an IterableDataset once torch is imported
_TORCH_DATASETS = frozenset({
    "DataPipeline", "DirectoryShardList", "ExactEpochShards", "FluidWrapper", "MockDataset",
    "MultiShardSample", "RandomMix", "ResampledShards", "RoundRobin", "SimpleShardList",
    "WebDataset", "WebLoader", "with_epoch", "with_length",
})
#: the rooms and top-level modules, importable as attributes like any submodule
_SUBMODULES = frozenset({
    "cache", "cli", "codecs", "dataset", "errors", "handlers", "io", "parallel", "pipeline",
    "pytorch", "router", "settings", "stores", "tar", "testing", "urls",
})

__all__ = sorted(_EXPORTS)

#: names that are both a module and a public function of this package, as in webdataset
_SHADOWED_MODULES = frozenset({"gopen"})


class _Package(types.ModuleType):
    """This package's module type: importing the submodule ``wds_cloud.gopen`` makes the import
    system bind it as the package attribute ``gopen``; the function keeps that name instead,
    as in webdataset (where ``webdataset.gopen`` is the function and the module is reached only
    through ``sys.modules``, ``import webdataset.gopen`` or ``from webdataset.gopen import``)."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _SHADOWED_MODULES and isinstance(value, types.ModuleType):
            value = getattr(value, name)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is not None:
        value = getattr(importlib.import_module(f".{module}", __name__), name)
        globals()[name] = value
        if name in _TORCH_DATASETS:
            importlib.import_module(".torch_datasets", __name__).register_torch_datasets()
        return value
    if name in _MODULE_ALIASES or name in _SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'wds_cloud' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS) | set(_MODULE_ALIASES) | _SUBMODULES)
