"""webdataset's fluid interface: ``dataset.decode("rgb").to_tuple("jpg", "cls").batched(16)``.

Each method is a one-liner appending the stage of the same name from
:mod:`wds_cloud.pipeline.filters` to a *copy* of the pipeline (``compose``), so the original is left
unchanged, as in webdataset. The mixin expects the class it is mixed into to provide
``compose(*stages)`` (every :class:`~wds_cloud.pipeline.Pipeline` does).

Differences from webdataset 1.0.2: ``listed(partial=False)`` is honoured (webdataset ignored it);
``lmdb_cached`` is not provided.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from ..handlers import Handler, reraise_exception
from ..settings import Settings
from . import filters

__all__ = ["FluidInterface"]

F = TypeVar("F", bound="FluidInterface")


class FluidInterface:
    """Chainable stage methods; each returns a new pipeline with one more stage."""

    #: the settings of the pipeline's composition root (a ``WebDataset`` sets them), for the
    #: defaults of ``decode``; ``None``: the decoder reads the environment itself
    settings: Settings | None = None

    if TYPE_CHECKING:

        # provided by Pipeline (whose compose returns a copy of the same class)
        def compose(self, *args: Any) -> Any: ...

    def batched(
        self: F, batchsize: int, collation_fn: Callable[[list[Any]], Any] | None = (
            filters.default_collation_fn
        ), partial: bool = True,
    ) -> F:
        """Group samples into batches of ``batchsize``, collated with ``collation_fn``."""
        return self.compose(filters.batched(batchsize, collation_fn=collation_fn, partial=partial))

    def unbatched(self: F) -> F:
        """Turn batches back into samples."""
        return self.compose(filters.unbatched())

    def listed(self: F, batchsize: int, partial: bool = True) -> F:
        """Group samples into lists of ``batchsize`` without collation."""
        return self.compose(filters.listed(batchsize, partial=partial))

    def unlisted(self: F) -> F:
        """Turn lists of samples back into samples."""
        return self.compose(filters.unlisted())

    def log_keys(self: F, logfile: str | None = None) -> F:
        """Append each sample's key to ``logfile`` (nothing if ``None``)."""
        return self.compose(filters.log_keys(logfile))

    def shuffle(self: F, size: int, **kw: Any) -> F:
        """Shuffle samples in a buffer of ``size``; ``size < 1`` leaves the order alone."""
        if size < 1:
            return self
        return self.compose(filters.shuffle(size, **kw))

    def map(self: F, f: Callable[[Any], Any], handler: Handler = reraise_exception) -> F:
        """Replace each sample by ``f(sample)``."""
        return self.compose(filters.map(f, handler=handler))

    def decode(
        self: F, *args: Any, pre: Any = None, post: Any = None, only: Any = None,
        partial: bool = False, handler: Handler = reraise_exception, secure: bool | None = None,
    ) -> F:
        """Decode sample fields by extension with the given handlers or image spec strings.

        ``secure=None`` takes ``WDS_SECURE`` as the pipeline's settings say (a ``WebDataset``
        read them when it was built), else as the environment says when decoding starts.
        """
        kw: dict[str, Any] = {}
        if self.settings is not None:
            kw["weights_only"] = self.settings.pytorch_weights_only
            secure = self.settings.secure if secure is None else secure
        return self.compose(filters.decode(*args, pre=pre, post=post, only=only, partial=partial,
                                           handler=handler, secure=secure, **kw))

    def map_dict(self: F, handler: Handler = reraise_exception, **kw: Callable[[Any], Any]) -> F:
        """Replace ``sample[key]`` by ``kw[key](sample[key])``."""
        return self.compose(filters.map_dict(handler=handler, **kw))

    def select(self: F, predicate: Callable[[Any], Any], **kw: Any) -> F:
        """Keep the samples for which ``predicate(sample)`` is true."""
        return self.compose(filters.select(predicate, **kw))

    def to_tuple(self: F, *args: Any, **kw: Any) -> F:
        """Turn dict samples into tuples of the given fields (``"jpg;png"`` alternatives)."""
        return self.compose(filters.to_tuple(*args, **kw))

    def map_tuple(self: F, *args: Any, handler: Handler = reraise_exception) -> F:
        """Apply one function per tuple element."""
        return self.compose(filters.map_tuple(*args, handler=handler))

    def slice(self: F, *args: int | None) -> F:
        """``itertools.islice`` of the sample stream."""
        return self.compose(filters.slice(*args))

    def rename(self: F, **kw: Any) -> F:
        """Rename fields: ``rename(new="old1;old2")``."""
        return self.compose(filters.rename(**kw))

    def rsample(self: F, p: float = 0.5) -> F:
        """Keep each sample with probability ``p``."""
        return self.compose(filters.rsample(p))

    def rename_keys(self: F, *args: Any, **kw: Any) -> F:
        """Rename fields by glob patterns."""
        return self.compose(filters.rename_keys(*args, **kw))

    def extract_keys(self: F, *args: Any, **kw: Any) -> F:
        """Turn samples into tuples of the fields matching the glob patterns."""
        return self.compose(filters.extract_keys(*args, **kw))

    def xdecode(self: F, *args: Any, **kw: Any) -> F:
        """Decode fields with explicit ``(pattern, function)`` decoders."""
        return self.compose(filters.xdecode(*args, **kw))

    def mcached(self: F) -> F:
        """Keep the first epoch's samples in memory and replay them in later epochs."""
        return self.compose(filters.Cached())

    def lmdb_cached(self: F, *args: Any, **kw: Any) -> F:
        """Record the first epoch's samples in an LMDB database and replay them from it
        (:class:`~wds_cloud.pipeline.samplecache.LMDBCached`: ``fname``, ``map_size``, ...)."""
        return self.compose(filters.LMDBCached(*args, **kw))
