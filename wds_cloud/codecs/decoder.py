"""Decoding samples by extension, with webdataset 1.0.2's ``autodecode`` API and semantics.

A :class:`Decoder` holds a chain of handlers ``pre + handlers + post`` (by default ``pre`` is
``[gzfilter]`` and ``post`` ``[basichandlers]``). Each field ``k`` of a sample whose value is
bytes is offered to the handlers in order as ``handler("." + k, data)``; the first result that
is not ``None`` wins, a :class:`Continue` result replaces key and data and carries on with the
next handler, and a field no handler claims stays bytes. Fields named ``__*`` are never
decoded (bytes become ``str``); with ``only=`` the fields not listed are left alone; with
``partial=True`` values that are not bytes pass through, otherwise they are an error. Any
failure is raised as :class:`DecodingError` naming the sample, its URL and the field.

Speed: the chain is resolved once per field name into the few functions that can act on it
(the built-in handlers say which names they claim), so decoding a field is a dict lookup and
a direct call to e.g. ``int`` or ``json.loads``. Handlers written by users are still called
for every field, as in webdataset.

Security: ``.pyd``/``.pickle``/``.pkl`` (pickle) and ``.pth`` (``torch.load``) can run code.
``Decoder(..., secure=True)``, or ``WDS_SECURE=1`` when ``secure`` is not given, refuses them;
webdataset's module flag ``wds_cloud.utils.enforce_security`` (``wds.utils``), read at each such
field, wins when set to True or False (see :mod:`wds_cloud.utils`).
"""

from __future__ import annotations

import gzip
import logging
from collections.abc import Callable, Iterable
from functools import partial as _partial
from typing import Any

from ..errors import ConfigError
from ..settings import Settings
from .basic import (
    UNSAFE,
    DecodingError,
    basichandlers,
    cbor_loads,
    decoders,
    guarded,
    msgpack_loads,
    npy_loads,
    npz_loads,
    tenbin_loads,
    torch_audio,
    torch_load,
    torch_loads,
    torch_video,
    unpickle_loads,
)
from .images import IMAGE_EXTENSIONS, ImageHandler, imagehandler, imagespecs

__all__ = [
    "IMAGE_EXTENSIONS",
    "Continue",
    "Decoder",
    "DecodingError",
    "ImageHandler",
    "basichandlers",
    "call_extension_handler",
    "cbor_loads",
    "decoders",
    "default_post_handlers",
    "default_pre_handlers",
    "gzfilter",
    "handle_extension",
    "imagehandler",
    "imagespecs",
    "make_decoder",
    "msgpack_loads",
    "npy_loads",
    "npz_loads",
    "pytorch_weights_only",
    "tenbin_loads",
    "torch_audio",
    "torch_loads",
    "torch_video",
    "unpickle_loads",
]

log = logging.getLogger(__name__)

HandlerFn = Callable[[str, bytes], Any]

#: ``weights_only`` for ``torch.load`` of ``.pth`` members (patchable, as in webdataset); ``None``
#: leaves it to the decoder's ``weights_only`` (``WDS_PYTORCH_WEIGHTS_ONLY``, default off).
pytorch_weights_only: bool | None = None


class Continue:
    """A handler result meaning: go on with the next handlers, using this ``key`` and ``data``."""

    def __init__(self, key: str, data: bytes) -> None:
        self.key, self.data = key, data


def _gunzip(key: str, data: bytes) -> Continue:
    return Continue(key, gzip.decompress(data))


class _GzFilter:
    """Pre-handler: ``x.gz`` members are decompressed, then decoded as ``x``."""

    def _wds_plan(self, key: str) -> Callable[[bytes], Any] | None:
        return _partial(_gunzip, key[:-3]) if key.endswith(".gz") else None

    def __call__(self, key: str, data: bytes) -> Continue | None:
        return _gunzip(key[:-3], data) if key.endswith(".gz") else None

    def __reduce__(self) -> str:
        return "gzfilter"

    def __repr__(self) -> str:
        return "gzfilter"


gzfilter = _GzFilter()
default_pre_handlers: list[HandlerFn] = [gzfilter]
default_post_handlers: list[HandlerFn] = [basichandlers]


def call_extension_handler(key: str, data: bytes, f: Callable[[bytes], Any],
                           extensions: Iterable[str]) -> Any:
    """``f(data)`` if ``key`` ends with one of the (dotted) ``extensions``, else ``None``."""
    return f(data) if _ends_with(key, [e.lower().split(".") for e in extensions]) else None


def _ends_with(key: str, targets: list[list[str]]) -> bool:
    parts = key.lower().split(".")
    return any(len(t) <= len(parts) and parts[-len(t):] == t for t in targets)


class _ExtensionHandler:
    def __init__(self, extensions: str | Iterable[str], f: Callable[[bytes], Any]) -> None:
        names = extensions.split() if isinstance(extensions, str) else list(extensions)
        self.extensions = [e.lower() for e in names]
        self.f = f
        self._targets = [e.split(".") for e in self.extensions]

    def _wds_plan(self, key: str) -> Callable[[bytes], Any] | None:
        return self.f if _ends_with(key, self._targets) else None

    def __call__(self, key: str, data: bytes) -> Any:
        return self.f(data) if _ends_with(key, self._targets) else None

    def __repr__(self) -> str:
        return f"handle_extension({' '.join(self.extensions)!r}, {self.f!r})"


def handle_extension(extensions: str | Iterable[str], f: Callable[[bytes], Any]) -> HandlerFn:
    """A handler calling ``f(data)`` for fields ending in one of ``extensions``.

    ``extensions`` is space separated; an extension may contain dots (``"seg.jpg"`` matches
    ``x.seg.jpg`` only); comparison ignores case.
    """
    return _ExtensionHandler(extensions, f)


class _Plan(tuple[Callable[[bytes], Any], ...]):
    """The functions that may decode one field name, with their positions in the chain."""

    positions: tuple[int, ...]


_META = object()  # plan of ``__*`` fields
_KEEP = object()  # plan of fields excluded by ``only``
_MAX_PLANS = 4096


def _handler_list(handlers: Any, what: str) -> list[HandlerFn]:
    if isinstance(handlers, (str, bytes)) or not isinstance(handlers, Iterable):
        raise ConfigError(f"Decoder {what} must be a list of handlers, got {handlers!r}")
    result = list(handlers)
    for i, h in enumerate(result):
        if not callable(h):
            raise ConfigError(f"Decoder {what}[{i}] = {h!r} is not callable")
    return result


class Decoder:
    """Decode samples (dicts of bytes) with a chain of handlers; see the module docstring.

    ``handlers`` is the main list; ``pre`` (default ``[gzfilter]``) runs before it and
    ``post`` (default ``[basichandlers]``) after it. ``only`` (list or space-separated string
    of field names) restricts decoding to those fields. ``partial=True`` passes values that
    are not bytes through. ``weights_only`` is ``torch.load``'s for ``.pth`` fields (default: the
    ``WDS_PYTORCH_WEIGHTS_ONLY`` setting; the module flag ``pytorch_weights_only`` wins when
    set). ``secure`` refuses pickle and ``torch.load`` (default: the ``WDS_SECURE`` setting;
    the module flag ``wds_cloud.utils.enforce_security``, read at each such field, wins when
    set). Calling the decoder returns a new dict; the input is not changed.
    """

    def __init__(
        self, handlers: Iterable[HandlerFn], pre: Iterable[HandlerFn] | None = None,
        post: Iterable[HandlerFn] | None = None, only: str | Iterable[str] | None = None,
        partial: bool = False, *, secure: bool | None = None, weights_only: bool | None = None,
    ) -> None:
        main = _handler_list(handlers, "handlers")
        before = default_pre_handlers if pre is None else _handler_list(pre, "pre")
        after = default_post_handlers if post is None else _handler_list(post, "post")
        self.handlers: list[HandlerFn] = [*before, *main, *after]
        if isinstance(only, str):
            only = only.split()
        self.only: set[str] | None = None if only is None else set(only)
        self.partial = bool(partial)
        if secure is None or weights_only is None:  # used on its own: a composition root
            settings = Settings.from_env()
            secure = settings.secure if secure is None else secure
            weights_only = settings.pytorch_weights_only if weights_only is None else weights_only
        self.secure = bool(secure)
        self.weights_only = bool(weights_only)
        self._reset()

    def _reset(self) -> None:
        self._plans: dict[str, Any] = {}
        self._chains: dict[tuple[str, int], _Plan] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("_plans", "_chains")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset()

    def _chain(self, dkey: str, start: int) -> _Plan:
        """The handlers from ``start`` on that may act on the dotted key, as data-only calls."""
        fns, positions = [], []
        for i in range(start, len(self.handlers)):
            handler = self.handlers[i]
            planner = getattr(handler, "_wds_plan", None)
            fn = _partial(handler, dkey) if planner is None else planner(dkey)
            if fn is None:
                continue
            if fn is unpickle_loads or fn is torch_loads:
                what, unchecked = UNSAFE[fn]
                if unchecked is torch_load:
                    unchecked = _partial(torch_load, weights_only=self.weights_only)
                # guarded per call: the module flag wds_cloud.utils.enforce_security may change
                fn = _partial(guarded, what, dkey[1:], self.secure, unchecked)
            fns.append(fn)
            positions.append(i)
        plan = _Plan(fns)
        plan.positions = tuple(positions)
        return plan

    def _plan(self, k: str) -> Any:
        if k[:2] == "__":
            plan: Any = _META
        elif self.only is not None and k not in self.only:
            plan = _KEEP
        else:
            plan = self._chain("." + k, 0)
        if len(self._plans) >= _MAX_PLANS:
            self._plans.clear()
        self._plans[k] = plan
        return plan

    def _run(self, dkey: str, data: Any, start: int) -> Any:
        """Offer ``data`` to the handlers from ``start`` on (the slow path, after Continue)."""
        while True:
            chain = self._chains.get((dkey, start))
            if chain is None:
                if len(self._chains) >= _MAX_PLANS:
                    self._chains.clear()
                chain = self._chains[(dkey, start)] = self._chain(dkey, start)
            for fn, position in zip(chain, chain.positions, strict=True):
                result = fn(data)
                if isinstance(result, Continue):
                    dkey, data, start = result.key, result.data, position + 1
                    break
                if result is not None:
                    return result
            else:
                return data

    def decode1(self, key: str, data: bytes) -> Any:
        """Decode one field named ``key`` (no leading dot) through the whole chain."""
        return self._run("." + key, data, 0)

    def decode(self, sample: dict[str, Any]) -> dict[str, Any]:
        """Decode every field of ``sample``; raise :class:`DecodingError` naming the field."""
        if not isinstance(sample, dict):
            raise DecodingError(reason=f"a sample must be a dict, got {type(sample).__name__}")
        plans = self._plans
        result: dict[str, Any] = {}
        k = None
        try:
            for k, v in sample.items():
                plan = plans.get(k)
                if plan is None:
                    plan = self._plan(k)
                if plan.__class__ is _Plan:
                    if v.__class__ is memoryview:  # WebDataset(zero_copy=True)'s values
                        v = v.tobytes()
                    if isinstance(v, bytes):
                        for fn in plan:
                            r = fn(v)
                            if r is not None:
                                v = self._resume(plan, fn, r) if isinstance(r, Continue) else r
                                break
                    elif not self.partial:
                        raise TypeError(
                            f"value is {type(v).__name__}, not bytes; pass partial=True to "
                            "leave fields that are already decoded alone"
                        )
                elif plan is _META and v.__class__ is bytes:
                    v = _meta_text(k, v)
                result[k] = v
        except Exception as exn:
            # a decoder function's own DecodingError (a secure-mode refusal) knows only the
            # field: give its reason once, with the sample and URL, not nested in a second one
            bare = isinstance(exn, DecodingError) and exn.key is None and exn.url is None \
                and exn.reason
            raise DecodingError(
                url=sample.get("__url__"), key=sample.get("__key__"), k=k, sample=sample,
                reason=exn.reason if isinstance(exn, DecodingError) and bare
                else f"{type(exn).__name__}: {exn}",
            ) from exn
        return result

    def _resume(self, plan: _Plan, fn: Callable[[bytes], Any], cont: Continue) -> Any:
        return self._run(cont.key, cont.data, plan.positions[plan.index(fn)] + 1)

    __call__ = decode

    def __repr__(self) -> str:
        return (f"Decoder({self.handlers!r}, only={self.only!r}, partial={self.partial}, "
                f"secure={self.secure})")


def _meta_text(k: str, v: bytes) -> Any:
    try:
        return v.decode("utf-8")
    except UnicodeDecodeError:
        log.warning("metadata field %r is not UTF-8; left as bytes", k)
        return v


def make_decoder(
    *args: str | HandlerFn, handler: Callable[[BaseException], bool] | None = None,
    pre: Iterable[HandlerFn] | None = None, post: Iterable[HandlerFn] | None = None,
    only: str | Iterable[str] | None = None, partial: bool = False, secure: bool | None = None,
    weights_only: bool | None = None,
) -> Decoder:
    """Turn the arguments of ``.decode(*args, **kw)`` into a :class:`Decoder`.

    Strings are image specs (``"pil"``, ``"rgb8"``, ``"torchrgb"``, ...) turned into
    :func:`imagehandler`; anything else is a handler ``(key, data) -> value | None``.
    ``handler`` is the exception handler of the calling stage: the stage applies it, this
    function accepts it only so that the stage can forward its keyword arguments unchanged.
    """
    handlers = [imagehandler(a) if isinstance(a, str) else a for a in args]
    return Decoder(handlers, pre=pre, post=post, only=only, partial=partial, secure=secure,
                   weights_only=weights_only)


def __getattr__(name: str) -> Any:
    # built on first use: a Decoder reads WDS_SECURE, which must not happen at import time
    if name == "default_decoder":
        value = globals()["default_decoder"] = Decoder([])
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | {"default_decoder"})
