"""webdataset's helpers for composing stages by hand, with webdataset 1.0.2's names:
``FilterFunction``/``RestCurried`` (picklable currying, the ancestors of
:func:`~wds_cloud.pipeline.core.pipelinefilter`), ``compose2`` and ``pipeline``; and
:class:`RepeatedStage`, webdataset's ``extradatasets.repeatedly`` stage class.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from .core import PipelineStage, repeatedly

__all__ = ["FilterFunction", "RepeatedStage", "RestCurried", "compose2", "pipeline"]


class FilterFunction:
    """``f`` with its arguments after the first bound: ``FilterFunction(f, *a, **kw)(data) ==
    f(data, *a, **kw)``; picklable when ``f`` is."""

    def __init__(self, f: Callable[..., Any], *args: Any, **kw: Any) -> None:
        self.f = f
        self.args = args
        self.kw = kw

    def __call__(self, data: Any) -> Any:
        return self.f(data, *self.args, **self.kw)

    def __str__(self) -> str:
        return f"<{getattr(self.f, '__name__', self.f)} {self.args} {self.kw}>"

    __repr__ = __str__


class RestCurried:
    """``RestCurried(f)(*a, **kw)`` is ``FilterFunction(f, *a, **kw)``."""

    def __init__(self, f: Callable[..., Any]) -> None:
        self.f = f

    def __call__(self, *args: Any, **kw: Any) -> FilterFunction:
        return FilterFunction(self.f, *args, **kw)


def compose2(f: Callable[[Any], Any], g: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``g(f(x))``, as a picklable function of ``x``."""
    from .filters import compose

    return compose(f, g)


def pipeline(source: Iterable[Any], *args: Callable[[Any], Any]) -> Any:
    """``source`` through the filters ``args`` in turn (``source`` itself if there are none)."""
    if not args:
        return source
    from .filters import compose

    return compose(*args)(source)


class RepeatedStage(PipelineStage):
    """webdataset's ``extradatasets.repeatedly``: a stage iterating its input again and again,
    ``nepochs`` passes or ``nbatches`` items at most (:func:`~wds_cloud.pipeline.core.repeatedly`
    does the work). ``source`` and ``length`` are kept as attributes, as webdataset kept them
    (its stage forgot ``nepochs`` and failed when run; this one uses it)."""

    def __init__(self, source: Any = None, nepochs: int | None = None,
                 nbatches: int | None = None, length: int | None = None) -> None:
        self.source = source
        self.nepochs = nepochs
        self.nbatches = nbatches
        self.length = length

    def invoke(self, source: Iterable[Any]) -> Any:
        return repeatedly(source, nepochs=self.nepochs, nbatches=self.nbatches)
