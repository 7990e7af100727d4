"""webdataset's module path ``webdataset.utils``: its public, mutable flag ``enforce_security``
and the rest of its grab bag of helpers, under that one name.

A small module of its own rather than an alias: what reads the flag lives in several rooms
(the decoders in :mod:`wds_cloud.codecs`, the router), so the flag sits at the bottom layer,
where all of them can read it. It is the one module of that name: ``wds.utils`` and
``import wds_cloud.utils`` are this module, so setting the flag here reaches every reader.

webdataset's other helpers are here too, doing what webdataset 1.0.2's do (``glob_with_braces``,
``make_seed``, ``obsolete``, ...). Five names live a layer up and are looked up only when asked
for, so this module stays at L0 (stdlib and braceexpand): ``PipelineStage`` and ``repeatedly``
(:mod:`wds_cloud.pipeline.core`; ``repeatedly`` is ``wds.repeatedly``, as in webdataset),
``identity`` (:mod:`wds_cloud.pipeline.keys`), ``pytorch_worker_info`` and
``pytorch_worker_seed`` (:mod:`wds_cloud.pytorch`, the only module that asks torch where it
runs).

``enforce_security`` (set it as ``wds.utils.enforce_security = True``, as with webdataset):

``None`` (the default)
    As ``WDS_SECURE`` says, read once by the composition root (``Settings.secure``: the
    ``WebDataset``, ``gopen``, a ``Decoder`` built on its own) or given as ``secure=``:
    when on, what can run code is refused: unpickling (``.pyd``, ``.pickle``, ``.pkl``),
    ``torch.load`` (``.pth``) and ``pipe:`` URLs. Local paths and URL rewriting stay allowed,
    so datasets on local disk keep working under ``WDS_SECURE=1``.
``True``
    Everything webdataset 1.0.2 refuses: the above, plus local paths and ``file:`` URLs
    (through ``gopen`` and the datasets, reading or writing) and URL rewriting
    (``WDS_REWRITE``/``GOPEN_REWRITE``). Only remote stores (and ``-``) can be read.
``False``
    Nothing is refused, even with ``WDS_SECURE=1`` or ``secure=True``.

webdataset initialised the flag from ``WDS_SECURE`` when imported; here nothing reads the
environment at import time (only :mod:`wds_cloud.settings` reads it), hence ``None``.
The flag is read at the point of use, each time, so setting it takes effect at once in this
process. It is a plain module attribute: DataLoader workers started by ``fork`` inherit it,
workers started by ``spawn`` or ``forkserver`` import the module afresh and see ``None``
(set it in ``worker_init_fn``, or use ``WDS_SECURE=1``, which every process reads).
A refusal raises a ``ValueError`` subclass (as webdataset's ``ValueError``) saying what was
refused and why.
"""

from __future__ import annotations

import fnmatch
import functools
import glob
import importlib
import itertools
import re
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import braceexpand

__all__ = [
    "ObsoleteException",
    "compute_sample_weights",
    "deprecated",
    "enforce_security",
    "fnmatch_with_braces",
    "glob_with_braces",
    "guess_batchsize",
    "is_iterable",
    "lookup_sym",
    "make_seed",
    "obsolete",
    "refuses_code",
    "refuses_sources",
    "repeatedly0",
    "safe_eval",
    "why_refused",
]

#: names defined a layer up -> their module (relative to the package), imported on first use
#: (in ``dir()``, not in ``__all__``: ``from wds_cloud.utils import *`` stays at L0)
_LAZY: dict[str, str] = {
    "PipelineStage": "pipeline.core",
    "identity": "pipeline.keys",
    "pytorch_worker_info": "pytorch",
    "pytorch_worker_seed": "pytorch",
    "repeatedly": "pipeline.core",
}

#: ``None``: as ``WDS_SECURE``/``secure=`` say; ``True``: refuse all webdataset refuses;
#: ``False``: refuse nothing (see the module docstring)
enforce_security: bool | None = None


def refuses_code(secure: bool) -> bool:
    """Whether to refuse what can run code (unpickling, ``torch.load``, ``pipe:``), given the
    ``secure`` setting of the caller (``Settings.secure`` or a ``secure=`` argument): the
    module flag when it is set, else ``secure``."""
    flag = enforce_security
    return bool(secure) if flag is None else bool(flag)


def refuses_sources() -> bool:
    """Whether to refuse local paths, ``file:`` URLs and URL rewriting: only when the module
    flag is set to a true value (webdataset's secure mode)."""
    flag = enforce_security
    return flag is not None and bool(flag)


def why_refused(*, source: str = "secure=True or WDS_SECURE=1",
                undo: str = "pass secure=False or unset WDS_SECURE") -> str:
    """The reason given in refusal messages: which switch is on, and how to turn it off
    (``source`` and ``undo`` name the caller's own switch, for when the flag is not set)."""
    if enforce_security is not None and enforce_security:
        return ("wds_cloud.utils.enforce_security (webdataset.utils.enforce_security) is True; "
                "if you trust this data, set it to False, or to None to follow WDS_SECURE")
    return f"secure mode is on ({source}); if you trust this data, {undo}"


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"..{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


def glob_with_braces(pattern: str) -> list[str]:
    """The files matching the glob ``pattern`` after brace expansion (``a{1,2}/*.tar``)."""
    return [f for pat in braceexpand.braceexpand(pattern) for f in glob.glob(pat)]


def fnmatch_with_braces(filename: str, pattern: str) -> bool:
    """Whether ``filename`` matches the ``fnmatch`` ``pattern`` after brace expansion."""
    return any(fnmatch.fnmatch(filename, pat) for pat in braceexpand.braceexpand(pattern))


def make_seed(*args: Any) -> int:
    """A 31-bit seed from ``args``, as webdataset computes it (from ``hash()``, so a string
    gives a different seed in each process unless ``PYTHONHASHSEED`` is set; wds_cloud's own
    streams use :func:`wds_cloud.derive_seed`)."""
    seed = 0
    for arg in args:
        seed = (seed * 31 + hash(arg)) & 0x7FFFFFFF
    return seed


def is_iterable(obj: Any) -> bool:
    """Whether ``obj`` is iterable, strings and bytes excepted."""
    if isinstance(obj, (str, bytes)):
        return False
    return isinstance(obj, Iterable)


def safe_eval(s: str, expr: str = "{}") -> Any:
    """``eval(expr.format(s))`` when ``s`` is a plain identifier or number (letters, digits,
    ``_``); anything else raises ``ValueError``."""
    if re.sub("[^A-Za-z0-9_]", "", s) != s:
        raise ValueError(f"safe_eval: illegal characters in: '{s}'")
    return eval(expr.format(s))


def lookup_sym(sym: str, modules: list[str]) -> Any:
    """The first non-``None`` attribute ``sym`` of the ``modules`` (names relative to this
    package, such as ``".filters"``, or absolute); ``None`` if none has it."""
    for mname in modules:
        module = importlib.import_module(mname, package="wds_cloud")
        result = getattr(module, sym, None)
        if result is not None:
            return result
    return None


def repeatedly0(loader: Iterable[Any], nepochs: int = sys.maxsize,
                nbatches: int = sys.maxsize) -> Iterator[Any]:
    """Iterate ``loader`` ``nepochs`` times, at most ``nbatches`` items each time."""
    for _ in range(nepochs):
        yield from itertools.islice(loader, nbatches)


def guess_batchsize(batch: tuple[Any, ...] | list[Any]) -> int:
    """The batch size of a batch in columns: the length of its first column."""
    return len(batch[0])


def deprecated(arg: Any = None) -> Any:
    """Decorator, bare (``@deprecated``) or with a reason (``@deprecated("use x")``): calling
    the function warns with a ``DeprecationWarning``."""
    reason = None if callable(arg) else arg

    def decorator(func: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(func)
        def new_func(*args: Any, **kwargs: Any) -> Any:
            msg = f"Call to deprecated function {func.__name__}."
            if reason is not None:
                msg += " Reason: " + reason
            warnings.warn(msg, category=DeprecationWarning, stacklevel=2)
            return func(*args, **kwargs)

        return new_func

    return decorator(arg) if callable(arg) else decorator


class ObsoleteException(Exception):
    """Raised by a function marked :func:`obsolete` unless ``ALLOW_OBSOLETE=1``."""


def obsolete(func: Callable[..., Any] | None = None, *, reason: str | None = None) -> Any:
    """Decorator, bare or ``@obsolete(reason=...)``: calling the function raises
    :class:`ObsoleteException` unless the environment variable ``ALLOW_OBSOLETE`` is a
    non-zero integer (read at each call, through :class:`~wds_cloud.settings.Settings`)."""
    if func is None:
        return functools.partial(obsolete, reason=reason)
    wrapped = func

    @functools.wraps(wrapped)
    def new_func(*args: Any, **kwargs: Any) -> Any:
        from .settings import Settings

        if not int(Settings.from_env().environ.get("ALLOW_OBSOLETE", "0")):
            msg = (f"Call to obsolete function {wrapped.__name__}. "
                   "Set env ALLOW_OBSOLETE=1 to permit.")
            if reason is not None:
                msg += " Reason: " + reason
            raise ObsoleteException(msg)
        return wrapped(*args, **kwargs)

    return new_func


def compute_sample_weights(n_w_pairs: Iterable[tuple[float, float]]) -> Any:
    """``n * w`` for each ``(n, w)`` pair, scaled so the largest is 1 (a numpy array)."""
    import numpy as np  # only here: importing wds_cloud must not load numpy

    pairs = list(n_w_pairs)
    weighted = np.array([p[0] for p in pairs]) * np.array([p[1] for p in pairs])
    return weighted / np.amax(weighted)
