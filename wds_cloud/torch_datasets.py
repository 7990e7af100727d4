"""wds_cloud's datasets as ``torch.utils.data.IterableDataset`` instances, without importing torch.

``torch.utils.data.DataLoader`` treats a dataset as iterable only if it is an instance of
``torch.utils.data.IterableDataset``. That class is an ABC, so :func:`register_torch_datasets`
registers the pipeline, the shard lists and the mixers (``wds_cloud._TORCH_DATASETS``) as its
virtual subclasses as soon as torch defines it: at once if ``torch.utils.data`` is loaded, else
when it is, through a finder on ``sys.meta_path`` that watches for that one module (wrapt's
post-import hooks in a few lines; wrapt itself takes ~70 ms to import). So ``ds =
wds.WebDataset(...); import torch; DataLoader(ds)`` works, and a JAX or plain Python user never
loads torch (≈1.4 s). Not chosen: subclassing it (imports torch with every pipeline), or
appending it to our ``__bases__`` once torch is there (HuggingFace datasets'
``_maybe_add_torch_iterable_dataset_parent_class``: it needs torch at construction, and gives
our classes ``Dataset.__getitem__``/``__add__``).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import sys
import threading
from types import ModuleType
from typing import Any

from .pipeline import core as pipeline
from .pipeline import shards
from .pipeline.directory import DirectoryShardList

__all__ = ["TorchDataset", "add_length_method", "register_torch_datasets"]

log = logging.getLogger(__name__)

#: the module that defines ``torch.utils.data.IterableDataset``
_TORCH_DATASET_MODULE = "torch.utils.data.dataset"


def _dataset_classes() -> tuple[type, ...]:
    """The classes of ``wds_cloud._TORCH_DATASETS`` (the public classes that webdataset 1.0
    makes ``IterableDataset`` subclasses), or their bases: a registered class's subclasses
    (``DataPipeline``, ``WebDataset``, ``ResampledShards``...) follow it."""
    from .pipeline import exact, mix

    return (pipeline.Pipeline, pipeline.MockDataset, pipeline.with_epoch, pipeline.with_length,
            shards.SimpleShardList, shards.ShardResampler, DirectoryShardList,
            exact.ExactEpochShards, mix.RandomMix, mix.RoundRobin)


def _register_with(iterable_dataset: Any) -> None:
    for cls in _dataset_classes():
        iterable_dataset.register(cls)  # an ABC: registering twice changes nothing


class _RegisteringLoader(importlib.abc.Loader):
    """torch's own loader of ``torch.utils.data.dataset``, then :func:`_register_with`."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self.loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        module.__loader__ = self.loader  # the module keeps its own loader (source, resources)
        if module.__spec__ is not None:
            module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        try:
            _register_with(module.IterableDataset)
        except Exception:  # never break the user's ``import torch``
            log.warning("could not register wds_cloud's datasets as torch IterableDatasets",
                        exc_info=True)


class _TorchWatcher(importlib.abc.MetaPathFinder):
    """A finder that finds nothing itself: when ``torch.utils.data.dataset`` is about to be
    loaded, it lets the other finders find it and wraps its loader in a
    :class:`_RegisteringLoader`. It stays on ``sys.meta_path`` (removing a finder while
    another thread iterates the list could skip one); for other modules it costs a compare."""

    def find_spec(self, fullname: str, path: Any, target: ModuleType | None = None,
                  ) -> importlib.machinery.ModuleSpec | None:
        if fullname != _TORCH_DATASET_MODULE:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _RegisteringLoader(spec.loader)
                return spec
        return None


_watching = threading.Lock()


def register_torch_datasets() -> bool:
    """Make wds_cloud's datasets ``torch.utils.data.IterableDataset`` instances, now or
    whenever torch is imported; never imports torch.

    If this process has loaded ``torch.utils.data``, registers them as virtual subclasses of
    the ABC and returns True. Otherwise (the first time) puts a :class:`_TorchWatcher` on
    ``sys.meta_path`` that registers them when it is loaded, and returns False. Cheap and
    idempotent: datasets call it when constructed.
    """
    # never an import: sys.modules only (None also when torch is blocked)
    iterable_dataset = getattr(sys.modules.get(_TORCH_DATASET_MODULE), "IterableDataset", None)
    if iterable_dataset is not None:
        _register_with(iterable_dataset)
        return True
    with _watching:
        if not any(isinstance(f, _TorchWatcher) for f in sys.meta_path):
            sys.meta_path.insert(0, _TorchWatcher())
    return False


class TorchDataset:
    """Mixin: an unpickled copy (in a DataLoader worker started with ``spawn``, which imports
    torch before the dataset) is a torch ``IterableDataset`` there too."""

    def __setstate__(self, state: dict[str, Any]) -> None:
        register_torch_datasets()
        self.__dict__.update(state)


def add_length_method(obj: Any) -> Any:
    """webdataset's ``pipeline.add_length_method``: change ``obj``'s class to a subclass whose
    ``len(obj)`` is ``obj.size``, and that is a torch ``IterableDataset`` (when this process has
    loaded torch; wds_cloud's datasets are one anyway); returns ``obj``."""

    def length(self: Any) -> int:
        return int(self.size)

    cls = obj.__class__
    iterable_dataset = getattr(sys.modules.get(_TORCH_DATASET_MODULE), "IterableDataset", None)
    bases: tuple[type, ...] = (cls,)
    if iterable_dataset is not None and not issubclass(cls, iterable_dataset):
        bases = (cls, iterable_dataset)
    obj.__class__ = type(cls.__name__ + "_Length", bases, {"__len__": length})
    return obj
