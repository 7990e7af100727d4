"""Tar shards to samples: webdataset 1.0.2's ``tariterators`` API over a fast streaming reader.

The functions keep webdataset's names, arguments and yielded dict shapes. They never open a URL
themselves: :func:`open_shards` and :func:`~wds_cloud.tar.shardloop.samples_from_shards` (the
fused loop, in :mod:`.shardloop`) take ``open_stream`` (a ``Callable[[str], BinaryIO]``),
which ``wds_cloud.dataset`` binds to ``gopen``.

Grouping (webdataset's rule): a member name splits into key = directory + basename up to the
basename's first dot, and suffix = the rest (lower-cased when ``lcase``); names without such a
split (no dot in the basename) are dropped. Adjacent members with the same key form one sample
``{"__key__", "__url__", ["__local_path__"], suffix: bytes, ...}``. Members whose name matches
``__*__`` (webdataset's metadata convention) are skipped. A suffix repeated within one sample is
a :class:`~wds_cloud.errors.ShardFormatError`.

Handler protocol, as in webdataset: an exception goes to ``handler(exn)``, which raises it, or
returns True (go on) or False (stop the whole iteration quietly). What "go on" skips depends on
what failed:

- a shard that cannot be opened or read (truncated, corrupt) is skipped from the failure on. Its
  samples completed before the failure are still yielded, including the last one when the
  failure names a member of another sample (a member's data cut short or running past the end
  of the stream: every member of the last sample had arrived). The sample the failure falls
  inside is dropped, since members of it may be lost (webdataset passes it on); so is the last
  one when the failure names no member (a cut header, a bad checksum, a stream error), as its
  members may not all have arrived. This holds for :func:`samples_from_shards` (what
  ``tarfile_to_samples`` and ``WebDataset`` use);
- a ``rename_files``/``select_files`` hook that raises, or a duplicate suffix, drops that one
  member (``rename_files`` returning None drops it quietly).

Handlers see an error naming the shard: ours carry ``url`` (redacted); others are wrapped
(``OSError`` in :class:`~wds_cloud.errors.OpenError`, anything else in
:class:`~wds_cloud.errors.ShardFormatError`, chained with ``from``); ``args`` are never
patched. Streams opened here are closed when their shard is done, on error and when the
consumer stops early.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Generator, Iterable, Iterator
from typing import Any, BinaryIO

from ..errors import (
    AccessDeniedError,
    OpenError,
    ShardFormatError,
    ShardNotFoundError,
    WdsCloudError,
)
from ..handlers import Handler, reraise_exception
from ..urls import redact
from .reader import Following, Marks, Member, iter_member_batches

__all__ = [
    "base_plus_ext",
    "group_by_keys",
    "meta_prefix",
    "meta_suffix",
    "open_shards",
    "tar_file_expander",
    "tar_file_iterator",
    "trace",
    "valid_sample",
]

log = logging.getLogger(__name__)

meta_prefix = "__"
meta_suffix = "__"
#: webdataset's debugging switch: when true, :func:`group_by_keys` logs each member's prefix,
#: suffix and the keys of the sample it is grouping at DEBUG (webdataset printed them)
trace = False
_SKIP_META = r"__[^/]*__($|/)"
_META = re.compile(_SKIP_META)
_BASE_PLUS_EXT = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")
_EOF_DEFAULT: Any = object()  # stands for webdataset's ``eof_value={}`` (a fresh {} per shard)


class EndOfShard(dict[str, Any]):
    """The item :func:`tar_file_expander` yields after each shard by default: webdataset
    1.0.2's ``{}`` (empty, ``== {}``, falsy), so that groupings end their sample there.

    Groupings written for webdataset 0.2, which had no such item, read ``item["fname"]`` and
    ``item["data"]`` of every item (open_clip's ``group_by_keys_nothrow``, at its first
    batch): here those are ``""`` and ``b""``, a name that keys no sample, so such code skips
    the marker instead of failing with ``KeyError``. Nothing is stored: ``in``, ``get`` and
    iteration see an empty dict."""

    def __missing__(self, key: str) -> Any:
        if key == "data":
            return b""
        if key in ("fname", "__url__"):
            return ""
        raise KeyError(key)

Sample = dict[str, Any]
Selector = Callable[[str], bool]
Renamer = Callable[[str], "str | None"]
OpenStream = Callable[..., BinaryIO]


def base_plus_ext(path: str) -> tuple[str, str] | tuple[None, None]:
    """Split ``path`` into (key, suffix) at the basename's first dot; (None, None) if none."""
    m = _BASE_PLUS_EXT.match(path)
    if m is None:
        return None, None
    return m.group(1), m.group(2)


def _regex_split(name: str) -> tuple[str, str] | None:
    m = _BASE_PLUS_EXT.match(name)
    return None if m is None else (m.group(1), m.group(2))


def _split_path(name: str) -> tuple[str, str] | None:
    """base_plus_ext without the regex for ordinary names (newlines change what "." matches)."""
    slash = name.rfind("/")
    dot = name.find(".", slash + 1)
    if dot > slash + 1 and (slash < 0 or "\n" not in name):
        return name[:dot], name[dot + 1:]
    return _regex_split(name)


def _split(name: str) -> tuple[str, str] | tuple[None, None]:
    return _split_path(name) or (None, None)


def valid_sample(sample: Any) -> bool:
    """Whether ``sample`` is a non-empty dict not marked ``__bad__`` (webdataset's check)."""
    return isinstance(sample, dict) and len(sample) > 0 and not sample.get("__bad__", False)


def _is_meta(name: str, skip_meta: re.Pattern[str] | None) -> bool:
    if "/" not in name and name.startswith(meta_prefix) and name.endswith(meta_suffix):
        return True
    return skip_meta is not None and skip_meta.match(name) is not None


def _brief(exn: BaseException, limit: int = 300) -> str:
    text = f"{type(exn).__name__}: {exn}"
    return text if len(text) <= limit else text[:limit] + "..."


def _chain(err: BaseException, cause: BaseException) -> BaseException:
    err.__cause__ = cause  # what ``raise err from cause`` records, for a handler to raise
    return err


def _open_error(exn: Exception, url: str, doing: str = "open") -> BaseException:
    """``exn`` if it is ours, else an OpenError (or subclass) naming ``url``, chained."""
    if isinstance(exn, WdsCloudError):
        return exn
    shown = redact(url)
    message = f"cannot {doing} shard {shown!r}: {_brief(exn)}"
    if isinstance(exn, FileNotFoundError):
        return _chain(ShardNotFoundError(message, url=shown), exn)
    if isinstance(exn, PermissionError):
        return _chain(AccessDeniedError(message, url=shown), exn)
    return _chain(OpenError(message, url=shown), exn)


def _read_error(exn: Exception, url: str) -> BaseException:
    """An error met while reading a shard, as the handler should see it."""
    if isinstance(exn, (WdsCloudError, OSError)):
        return _open_error(exn, url, "read")
    return _chain(ShardFormatError(f"cannot read the shard: {_brief(exn)}", url=redact(url)), exn)


def _hook_error(exn: Exception, url: str, name: str, hook: str) -> BaseException:
    if isinstance(exn, WdsCloudError):
        return exn
    return _chain(
        ShardFormatError(f"{hook} raised {_brief(exn)}", url=redact(url), member=name), exn
    )


def _duplicate(url: str, name: str, suffix: str, key: str) -> ShardFormatError:
    return ShardFormatError(
        f"duplicate file name in tar file: a second {suffix!r} member for sample {key!r}; "
        f"each sample may hold one file per suffix (rename or remove one of them)",
        url=redact(url), member=name,
    )


def _url_of(source: Any) -> str:
    if isinstance(source, str):
        return source
    if isinstance(source, dict) and isinstance(source.get("url"), str):
        return source["url"]
    raise TypeError(f"expected a dict with a 'url' string (or a URL string), got "
                    f"{type(source).__name__} {str(source)[:80]!r}")


def open_shards(
    data: Iterable[dict[str, Any]], handler: Handler = reraise_exception, *,
    open_stream: OpenStream, **kw: Any,
) -> Iterator[dict[str, Any]]:
    """For each ``{"url": ...}`` yield the dict plus ``stream`` (and ``local_path`` when the
    stream has that attribute); ``kw`` goes to ``open_stream``. Open errors go to ``handler``.
    """
    for sample in data:
        url = _url_of(sample)
        try:
            stream = open_stream(url, **kw)
        except Exception as exn:
            if handler(_open_error(exn, url)):
                continue
            return
        out = dict(sample) if isinstance(sample, dict) else {"url": url}
        out["stream"] = stream
        local_path = getattr(stream, "local_path", None)
        if local_path is not None:
            out["local_path"] = local_path
        yield out


def _hooks(
    name: str, url: str, handler: Handler, select_files: Selector | None,
    rename_files: Renamer | None,
) -> tuple[str | None, bool]:
    """``(new name or None to drop the member, go on)`` after ``rename_files`` then
    ``select_files`` (webdataset's order); a hook's exception goes to ``handler``."""
    hook = "rename_files"
    try:
        new: str | None = name if rename_files is None else rename_files(name)
        hook = "select_files"
        if new is None or (select_files is not None and not select_files(new)):
            return None, True
        return new, True
    except Exception as exn:
        return None, bool(handler(_hook_error(exn, url, name, hook)))


class _Outcome:
    """How a shard ended: ``go_on`` is False when the handler said stop; ``damaged`` when a
    read or format error cut the shard short, and ``broken`` the member it names (None when it
    names none); ``error``: that error, when it is for the caller to hand to the handler (once
    the sample completed before it is out)."""

    __slots__ = ("broken", "damaged", "error", "go_on")

    def __init__(self) -> None:
        self.go_on = True
        self.damaged = False
        self.broken: str | None = None
        self.error: BaseException | None = None

    def handle(self, handler: Handler) -> bool:
        """Hand the deferred error (if any) to ``handler``; whether to go on."""
        if self.error is not None:
            error, self.error = self.error, None
            self.go_on = bool(handler(error))
        return self.go_on


def _batches(stream: BinaryIO, url: str, handler: Handler | None, outcome: _Outcome,
             marks: list[Marks] | None = None, following: Following | None = None,
             zero_copy: bool = False, resumed: bool = False) -> Iterator[list[Member]]:
    """The shard's member batches; a read error goes to ``handler``, whose answer (go on to
    the next shard, or stop) is stored in ``outcome``; with no handler the error is kept in
    ``outcome.error`` for the caller to hand on (:meth:`_Outcome.handle`). ``zero_copy``: see
    :func:`~wds_cloud.tar.reader.iter_member_batches`."""
    try:
        yield from iter_member_batches(stream, url=url, marks=marks, following=following,
                                       zero_copy=zero_copy, resumed=resumed)
    except Exception as exn:
        outcome.damaged = True
        member = getattr(exn, "member", None) if isinstance(exn, ShardFormatError) else None
        outcome.broken = member if isinstance(member, str) else None
        outcome.error = _read_error(exn, url)
        if handler is not None:
            outcome.handle(handler)


def _members(
    stream: BinaryIO, url: str, handler: Handler, skip_meta: re.Pattern[str] | None,
    select_files: Selector | None, rename_files: Renamer | None,
) -> Generator[Member, None, bool]:
    """The selected members of one shard; returns False when the handler says stop."""
    hooks = select_files is not None or rename_files is not None
    outcome = _Outcome()
    for batch in _batches(stream, url, handler, outcome):
        for name, data in batch:
            if _is_meta(name, skip_meta):
                continue
            if hooks:
                new, go_on = _hooks(name, url, handler, select_files, rename_files)
                if not go_on:
                    return False
                if new is None:
                    continue
                name = new
            yield name, data
    return outcome.go_on


def _stream_label(fileobj: Any) -> str:
    name = getattr(fileobj, "name", None)
    return name if isinstance(name, str) else repr(fileobj)


def tar_file_iterator(
    fileobj: BinaryIO, skip_meta: str | None = _SKIP_META, handler: Handler = reraise_exception,
    select_files: Selector | None = None, rename_files: Renamer | None = None,
) -> Iterator[dict[str, Any]]:
    """Yield ``{"fname": name, "data": bytes}`` for each regular member of the tar stream.

    Members matching ``skip_meta`` (a regex, matched at the start) are skipped; then
    ``rename_files(name)`` (None drops the member) and ``select_files(name)`` apply. The stream
    is not closed. A corrupt or truncated archive goes to ``handler``; the iteration ends there
    unless it raises.
    """
    meta = re.compile(skip_meta) if skip_meta is not None else None
    members = _members(fileobj, _stream_label(fileobj), handler, meta, select_files,
                       rename_files)
    for name, data in members:
        yield {"fname": name, "data": data}


def tar_file_expander(
    data: Iterable[dict[str, Any]], handler: Handler = reraise_exception,
    select_files: Selector | None = None, rename_files: Renamer | None = None,
    eof_value: Any = _EOF_DEFAULT,
) -> Iterator[dict[str, Any]]:
    """For each ``{"url", "stream"[, "local_path"]}`` yield its members as
    ``{"fname", "data", "__url__"[, "__local_path__"]}``, then ``eof_value`` (default: a fresh
    :class:`EndOfShard`, webdataset's ``{}``; None: nothing) so that :func:`group_by_keys`
    never merges samples across shards.
    Each stream is closed once its shard is done.
    """
    for source in data:
        url = _url_of(source)
        stream = source["stream"]
        local_path = source.get("local_path", getattr(stream, "local_path", None))
        try:
            members = _members(stream, url, handler, _META, select_files, rename_files)
            go_on = yield from _with_url(members, url, local_path)
        finally:
            stream.close()
        if eof_value is not None:
            yield EndOfShard() if eof_value is _EOF_DEFAULT else eof_value
        if not go_on:
            return


def _with_url(
    members: Generator[Member, None, bool], url: str, local_path: str | None,
) -> Generator[dict[str, Any], None, bool]:
    while True:
        try:
            name, data = next(members)
        except StopIteration as stop:
            return bool(stop.value)
        out = {"fname": name, "data": data, "__url__": url}
        if local_path is not None:
            out["__local_path__"] = local_path
        yield out


def group_by_keys(
    data: Iterable[dict[str, Any]], keys: Callable[[str], tuple[Any, Any]] = base_plus_ext,
    lcase: bool = True, suffixes: Iterable[str] | None = None, handler: Handler | None = None,
) -> Iterator[Sample]:
    """Group ``{"fname", "data", "__url__"[, "__local_path__"]}`` items into samples.

    Consecutive items whose ``keys(fname)`` prefix is equal form one sample; a ``{}`` item ends
    the current sample (shard boundary). Only suffixes in ``suffixes`` are kept (all if None).
    ``handler`` (default: raise) gets errors: a duplicate suffix drops that item when it
    returns True. Samples failing :func:`valid_sample` are not yielded.
    """
    handler = reraise_exception if handler is None else handler
    split: Callable[[str], tuple[Any, Any]] = _split if keys is base_plus_ext else keys
    wanted = None if suffixes is None else set(suffixes)
    current: Sample | None = None
    for item in data:
        if not item:
            if current is not None and valid_sample(current):
                yield current
            current = None
            continue
        fname, url = item["fname"], item.get("__url__")
        try:
            prefix, suffix = split(fname)
        except Exception as exn:
            if handler(_hook_error(exn, url or "", fname, "keys")):
                continue
            break
        if prefix is None:
            continue
        if lcase:
            suffix = suffix.lower()
        if trace:
            log.debug("group_by_keys: %s %s %s", prefix, suffix,
                      None if current is None else list(current))
        if current is None or prefix != current["__key__"]:
            if current is not None and valid_sample(current):
                yield current
            current = {"__key__": prefix, "__url__": url}
        if suffix in current:
            if handler(_duplicate(url or "", fname, suffix, prefix)):
                continue
            break
        if wanted is None or suffix in wanted:
            current[suffix] = item["data"]
        local_path = item.get("__local_path__")
        if local_path is not None:
            current["__local_path__"] = local_path
    if current is not None and valid_sample(current):
        yield current
