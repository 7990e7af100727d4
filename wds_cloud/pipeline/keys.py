"""Stages that pick, rename and decode the fields of samples, by key.

Field specs follow webdataset: ``"jpg;png"`` means the first of ``jpg`` or ``png`` present in
the sample, and ``to_tuple("jpg;png cls")`` takes two fields separated by a space. Key patterns
in ``rename_keys``, ``extract_keys`` and ``xdecode`` are ``fnmatch`` globs. Pattern matches
are computed once per distinct key, not once per sample. Re-exported by
:mod:`wds_cloud.pipeline.filters`.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from fnmatch import fnmatch
from operator import itemgetter
from typing import Any

from ..errors import ConfigError, ShardFormatError
from ..handlers import Handler, reraise_exception
from .core import pipelinefilter

__all__ = [
    "decode_bin",
    "decode_pickle",
    "decode_text",
    "default_decoders",
    "dict2tuple",
    "extract_keys",
    "find_decoder",
    "getfirst",
    "identity",
    "map_tuple",
    "parse_field_spec",
    "rename",
    "rename_keys",
    "to_tuple",
    "transform_with",
    "tuple2dict",
    "xdecode",
]

_MISSING = object()
_MAX_CACHED_KEYS = 4096  # bound on per-stage key caches, in case keys never repeat


def _alternatives(keys: str | Sequence[str], what: str) -> tuple[str, ...]:
    if isinstance(keys, str):
        if " " in keys:
            raise ConfigError(
                f"{what}: field {keys!r} contains a space; separate alternatives with ';' "
                f"(e.g. 'jpg;png')"
            )
        return tuple(keys.split(";"))
    return tuple(keys)


def _missing(sample: Any, alts: Sequence[str], what: str) -> ShardFormatError:
    get = getattr(sample, "get", None)
    key = get("__key__") if get else None
    url = get("__url__") if get else None
    have = list(sample.keys()) if hasattr(sample, "keys") else type(sample).__name__
    return ShardFormatError(
        f"{what}: sample {key!r} has none of the keys {list(alts)} (it has {have}); fix the "
        f"field names, or pass a handler (e.g. wds.warn_and_continue) to skip such samples",
        url=url if isinstance(url, str) else None,
    )


def _lookup(
    sample: Any, alts: Sequence[str], missing_is_error: bool, what: str, default: Any = None
) -> Any:
    for k in alts:
        if k in sample:
            return sample[k]
    if missing_is_error:
        raise _missing(sample, alts, what)
    return default


def getfirst(
    a: Mapping[str, Any], keys: str | Sequence[str], default: Any = None,
    missing_is_error: bool = True,
) -> Any:
    """Return ``a[k]`` for the first of ``keys`` (a list or ``"k1;k2"``) present in ``a``."""
    return _lookup(a, _alternatives(keys, "getfirst"), missing_is_error, "getfirst", default)


def transform_with(
    sample: Sequence[Any], transformers: Sequence[Any] | None
) -> Sequence[Any]:
    """Apply ``transformers[i]`` to ``sample[i]`` (a list); ``None`` (or a missing one) leaves it.

    Without transformers the sample itself is returned, as in webdataset.
    """
    if not transformers:
        return sample
    if len(transformers) > len(sample):
        raise ConfigError(
            f"transform_with: {len(transformers)} transformers for a sample of {len(sample)}"
        )
    result = list(sample)
    for i, f in enumerate(transformers):
        if f is not None:
            result[i] = f(sample[i])
    return result


def _to_tuple(
    data: Iterable[Any], *args: str | Sequence[str], handler: Handler = reraise_exception,
    missing_is_error: bool = True, none_is_error: bool | None = None,
) -> Iterator[tuple[Any, ...]]:
    if len(args) == 1 and isinstance(args[0], str) and " " in args[0]:
        args = tuple(args[0].split())
    if not args:
        raise ConfigError("to_tuple: give at least one field, e.g. to_tuple('jpg;png cls')")
    fields = [_alternatives(a, "to_tuple") for a in args]
    check_none = missing_is_error if none_is_error is None else none_is_error
    return _tuples(data, fields, missing_is_error, check_none, handler)


def _tuples(
    data: Iterable[Any], fields: list[tuple[str, ...]], missing_is_error: bool,
    check_none: bool, handler: Handler,
) -> Iterator[tuple[Any, ...]]:
    def slow(sample: Any) -> tuple[Any, ...]:
        return tuple(_lookup(sample, alts, missing_is_error, "to_tuple") for alts in fields)

    # fast path: one itemgetter call when no field has alternatives
    simple = all(len(alts) == 1 for alts in fields)
    get = itemgetter(*(alts[0] for alts in fields)) if simple else slow
    wrap = simple and len(fields) == 1
    for sample in data:
        try:
            try:
                result = get(sample)
            except KeyError:
                result = slow(sample)  # raises naming the missing field, or fills in None
            else:
                if wrap:
                    result = (result,)
            if check_none:
                for i, value in enumerate(result):
                    if value is None:
                        raise _missing(sample, fields[i], "to_tuple")
        except Exception as exn:
            if handler(exn):
                continue
            break
        yield result


def _map_tuple(
    data: Iterable[Any], *args: Callable[[Any], Any] | None, handler: Handler = reraise_exception
) -> Iterator[tuple[Any, ...]]:
    for i, f in enumerate(args):
        if f is not None and not callable(f):
            raise ConfigError(f"map_tuple: function {i} is not callable: {f!r}")
    fns = [(i, f) for i, f in enumerate(args) if f is not None]
    for sample in data:
        try:
            result = list(sample)
            n = len(result)
            for i, f in fns:
                if i < n:
                    result[i] = f(result[i])
        except Exception as exn:
            if handler(exn):
                continue
            break
        yield tuple(result)


def _rename(
    data: Iterable[Any], handler: Handler = reraise_exception, keep: bool = True,
    **kw: str | Sequence[str],
) -> Iterator[dict[str, Any]]:
    fields = [(new, _alternatives(old, "rename")) for new, old in kw.items()]
    replaced = {k for _, alts in fields for k in alts}
    for sample in data:
        try:
            renamed = {}
            for new, alts in fields:
                for k in alts:
                    if k in sample:
                        renamed[new] = sample[k]
                        break
                else:
                    raise _missing(sample, alts, "rename")
        except Exception as exn:
            if handler(exn):
                continue
            break
        if keep:
            result = {k: v for k, v in sample.items() if k not in replaced}
            result.update(renamed)
            yield result
        else:
            yield renamed


def _basename(path: str) -> str:
    return path.rsplit("/", 1)[-1]


def _extract_keys(
    source: Iterable[Any], *patterns: str | Sequence[str], duplicate_is_error: bool = True,
    ignore_missing: bool = False,
) -> Iterator[tuple[Any, ...]]:
    pats = [p.split(";") if isinstance(p, str) else list(p) for p in patterns]
    cache: dict[str, tuple[bool, ...]] = {}

    def hits(key: str) -> tuple[bool, ...]:
        found = cache.get(key)
        if found is None:
            if len(cache) >= _MAX_CACHED_KEYS:
                cache.clear()
            found = cache[key] = tuple(
                any(fnmatch("." + key, p) or fnmatch(key, p) for p in alts) for alts in pats
            )
        return found

    for sample in source:
        table = [(k, hits(k)) for k in sample]
        result = []
        for j, alts in enumerate(pats):
            matches = [k for k, h in table if h[j]]
            if not matches:
                if ignore_missing:
                    continue
                raise _missing(sample, alts, "extract_keys")
            if len(matches) > 1 and duplicate_is_error:
                raise ShardFormatError(
                    f"extract_keys: several keys {matches} of sample {sample.get('__key__')!r} "
                    f"match {alts}; make the pattern narrower or pass duplicate_is_error=False",
                    url=sample.get("__url__"),
                )
            result.append(sample[matches[0]])
        yield tuple(result)


def _rename_keys(
    source: Iterable[Any], *args: tuple[str, str], keep_unselected: bool = False,
    must_match: bool = True, duplicate_is_error: bool = True, **kw: str,
) -> Iterator[dict[str, Any]]:
    # later renamings win, as in webdataset
    renamings = [(pattern, new) for new, pattern in [*args, *kw.items()]][::-1]
    patterns = {pattern for pattern, _ in renamings}
    cache: dict[str, tuple[str, str] | None] = {}

    def target(path: str) -> tuple[str, str] | None:
        if len(cache) >= _MAX_CACHED_KEYS:
            cache.clear()
        fname = _basename(path).lower()
        found = cache[path] = next(((p, n) for p, n in renamings if fnmatch(fname, p)), None)
        return found

    for sample in source:
        result: dict[str, Any] = {}
        matched = set()
        for path, value in sample.items():
            try:
                hit = cache[path]
            except KeyError:
                hit = target(path)
            if hit is None:
                if keep_unselected:
                    result[path] = value
                continue
            matched.add(hit[0])
            if hit[1] in result:
                if duplicate_is_error:
                    raise ShardFormatError(
                        f"rename_keys: several keys of sample {sample.get('__key__')!r} are "
                        f"renamed to {hit[1]!r} ({list(sample)}); pass duplicate_is_error=False "
                        f"to keep the first", url=sample.get("__url__"),
                    )
                continue
            result[hit[1]] = value
        if must_match and matched != patterns:
            raise _missing(sample, sorted(patterns - matched), "rename_keys")
        yield result


def decode_bin(stream: io.BufferedIOBase | io.BytesIO) -> bytes:
    """Return the raw bytes."""
    return stream.read()


def decode_text(stream: io.BufferedIOBase | io.BytesIO) -> str:
    """Decode UTF-8 text."""
    return stream.read().decode("utf-8")


def decode_pickle(stream: io.BufferedIOBase | io.BytesIO) -> Any:
    """Unpickle (only for trusted data: unpickling can run code)."""
    return pickle.load(stream)


default_decoders: list[tuple[str, Callable[[Any], Any]]] = [
    ("*.bin", decode_bin),
    ("*.txt", decode_text),
    ("*.pyd", decode_pickle),
]


def find_decoder(decoders: Sequence[tuple[str, Any]], path: str) -> Any:
    """Return the decoder of the last pattern matching ``path`` (``None`` if none does)."""
    fname = _basename(path)
    if fname.startswith("__"):
        return identity
    fname = fname.lower()
    for pattern, fun in reversed(decoders):
        if fnmatch(fname, pattern) or fnmatch("." + fname, pattern):
            return fun
    return None


def parse_field_spec(fields: str | Sequence[str]) -> list[list[str]]:
    """webdataset's field spec as lists of alternatives: ``"jpg;png cls"`` (or
    ``["jpg;png", "cls"]``) -> ``[["jpg", "png"], ["cls"]]``."""
    if isinstance(fields, str):
        fields = fields.split()
    return [field.split(";") for field in fields]


def tuple2dict(values: Any) -> dict[Any, Any]:
    """A tuple or list as ``{0: values[0], 1: values[1], ...}``; a dict as it is."""
    if isinstance(values, dict):
        return values
    return dict(enumerate(values))


def dict2tuple(d: Mapping[int, Any]) -> tuple[Any, ...]:
    """The inverse of :func:`tuple2dict`: ``d[0], d[1], ... d[max key]``."""
    return tuple(d[i] for i in range(1 + max(d.keys())))


def identity(x: Any) -> Any:
    """Return ``x`` unchanged."""
    return x


def _xdecode(
    source: Iterable[Any], *args: tuple[str, Any], must_decode: bool = True,
    defaults: Sequence[tuple[str, Any]] = default_decoders, **kw: Any,
) -> Iterator[dict[str, Any]]:
    decoders = [*defaults, *args, *(("*." + k, v) for k, v in kw.items())]
    cache: dict[str, Any] = {}
    for sample in source:
        result = {}
        for path, data in sample.items():
            if path.startswith("__"):
                result[path] = data
                continue
            decoder = cache.get(path, _MISSING)
            if decoder is _MISSING:
                if len(cache) >= _MAX_CACHED_KEYS:
                    cache.clear()
                decoder = cache[path] = find_decoder(decoders, path)
            if decoder is None:
                if must_decode:
                    raise ShardFormatError(
                        f"xdecode: no decoder for {path!r} in sample {sample.get('__key__')!r};"
                        f" add one (e.g. xdecode({path.rsplit('.', 1)[-1]}=fn)) or pass "
                        f"must_decode=False", url=sample.get("__url__"),
                    )
            elif decoder is not False:
                data = decoder(io.BytesIO(data) if isinstance(data, bytes) else data)
            result[path] = data
        yield result


to_tuple = pipelinefilter(_to_tuple)
"""``to_tuple(*fields, handler=reraise_exception, missing_is_error=True, none_is_error=None)``."""
map_tuple = pipelinefilter(_map_tuple)
"""``map_tuple(*fns, handler=reraise_exception)``: ``fns[i]`` on field ``i``; ``None`` skips."""
rename = pipelinefilter(_rename)
"""``rename(handler=reraise_exception, keep=True, **new_to_old)``: rename fields."""
extract_keys = pipelinefilter(_extract_keys)
"""``extract_keys(*patterns, duplicate_is_error=True, ignore_missing=False)``: tuples."""
rename_keys = pipelinefilter(_rename_keys)
"""``rename_keys(*(new, pattern), keep_unselected=False, must_match=True,
duplicate_is_error=True, **new_to_pattern)``: rename keys matching globs."""
xdecode = pipelinefilter(_xdecode)
"""``xdecode(*(pattern, fn), must_decode=True, defaults=default_decoders, **ext_to_fn)``."""
