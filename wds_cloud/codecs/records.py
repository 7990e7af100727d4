"""Samples from record files: a sequence of CBOR (or MessagePack) maps, one map per sample.

Each record is a map with ``str`` keys (``bytes`` keys are read as UTF-8) whose values are the
fields, usually bytes, as in a tar sample. Every sample gets ``__url__`` (the file's URL),
``__key__`` when the record has none (``"{url}#{index}"``) and ``__local_path__`` when the
stream is a local file.

These are layer-2 functions: ``src`` yields dicts with a ``url`` and, optionally, an already
open ``stream``; otherwise the stream comes from ``open_stream(url)`` (bound to ``gopen`` in
:mod:`wds_cloud.dataset`) and is closed when the file is done. Errors go to ``handler``
(webdataset's protocol: raise, ``True`` to go on with the next file, ``False`` to stop); a
record that is not a map skips just that record when the handler says go on.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterable, Iterator
from typing import IO, Any

from ..errors import ConfigError, MissingDependencyError, ShardFormatError
from ..handlers import reraise_exception
from ..urls import redact

__all__ = ["cbor_file_samples", "msgpack_file_samples"]

Handler = Callable[[BaseException], bool]
OpenStream = Callable[[str], IO[bytes]]
_READ_SIZE = 1 << 16


class _Counter(io.RawIOBase):
    """A raw stream that counts the bytes it has read, so positions are exact on any stream."""

    def __init__(self, stream: IO[bytes]) -> None:
        super().__init__()
        self._stream, self.count = stream, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self._stream.read(len(buffer))
        n = len(data)
        buffer[:n] = data
        self.count += n
        return n

    def read(self, size: int = -1) -> bytes:
        data = self._stream.read(size)
        self.count += len(data)
        return data

    def tell(self) -> int:
        return self.count


def _truncated(kind: str, url: str, index: int, offset: int) -> ShardFormatError:
    return ShardFormatError(
        f"{kind} record file ends in the middle of record #{index}: the file is truncated; "
        "write or download it again", url=redact(url), offset=offset,
    )


def _invalid(kind: str, url: str, index: int, offset: int, exc: Exception) -> ShardFormatError:
    return ShardFormatError(
        f"record #{index} is not valid {kind} ({type(exc).__name__}: {exc}); is this really a "
        f"{kind} record file?",
        url=redact(url), offset=offset,
    )


def _cbor_records(stream: IO[bytes], url: str) -> Iterator[Any]:
    try:
        import cbor2
    except ImportError as exc:
        raise MissingDependencyError("reading cbor record files", "cbor2", "cbor") from exc
    buffered = io.BufferedReader(_Counter(stream), _READ_SIZE)
    decoder = cbor2.CBORDecoder(buffered)
    index = 0
    while buffered.peek(1):
        offset = buffered.tell()
        try:
            record = decoder.decode()
        except cbor2.CBORDecodeEOF as exc:
            raise _truncated("CBOR", url, index, offset) from exc
        except cbor2.CBORDecodeError as exc:
            raise _invalid("CBOR", url, index, offset, exc) from exc
        yield record
        index += 1


def _msgpack_records(stream: IO[bytes], url: str) -> Iterator[Any]:
    try:
        import msgpack
    except ImportError as exc:
        raise MissingDependencyError("reading msgpack record files", "msgpack", "msgpack") from exc
    counter = _Counter(stream)
    unpacker = msgpack.Unpacker(counter, raw=False, strict_map_key=False,
                                max_buffer_size=0, read_size=_READ_SIZE)
    index = 0
    while True:
        offset = unpacker.tell()
        try:
            record = next(unpacker)
        except StopIteration:
            if counter.count > offset:
                raise _truncated("MessagePack", url, index, offset) from None
            return
        except Exception as exc:
            raise _invalid("MessagePack", url, index, offset, exc) from exc
        yield record
        index += 1


def _as_sample(record: Any, url: str, index: int, local_path: str | None) -> dict[str, Any]:
    if not isinstance(record, dict):
        raise ShardFormatError(
            f"record #{index} is a {type(record).__name__}, not a map of fields; each record "
            "must be one sample", url=redact(url),
        )
    sample: dict[str, Any] = {}
    for k, v in record.items():
        if isinstance(k, bytes):
            k = k.decode("utf-8", "surrogateescape")
        elif not isinstance(k, str):
            raise ShardFormatError(f"record #{index} has a field named {k!r}; field names "
                                   "must be strings", url=redact(url))
        sample[k] = v
    sample.setdefault("__key__", f"{url}#{index}")
    sample["__url__"] = url
    if local_path is not None:
        sample["__local_path__"] = local_path
    return sample


def _open(item: Any, open_stream: OpenStream | None) -> tuple[str, IO[bytes], bool]:
    if not isinstance(item, dict) or ("url" not in item and "stream" not in item):
        raise ConfigError(f"record sources must be dicts with a 'url' (or 'stream'), got {item!r}")
    url = str(item.get("url", "<stream>"))
    stream = item.get("stream")
    if stream is not None:
        return url, stream, False
    if open_stream is None:
        raise ConfigError(f"no stream for {redact(url)!r}: give the source a 'stream' or pass "
                          "open_stream= (wds_cloud.cbors_to_samples opens URLs with gopen)")
    return url, open_stream(url), True


def _samples(
    src: Iterable[dict[str, Any]], handler: Handler, open_stream: OpenStream | None,
    records: Callable[[IO[bytes], str], Iterator[Any]],
) -> Iterator[dict[str, Any]]:
    for item in src:
        try:
            url, stream, owned = _open(item, open_stream)
        except Exception as exn:
            if handler(exn):
                continue
            return
        local_path = getattr(stream, "local_path", None) or item.get("local_path")
        try:
            for index, record in enumerate(records(stream, url)):
                try:
                    sample = _as_sample(record, url, index, local_path)
                except ShardFormatError as exn:
                    if handler(exn):
                        continue
                    return
                yield sample
        except Exception as exn:
            if not handler(exn):
                return
        finally:
            if owned:
                stream.close()


def cbor_file_samples(
    src: Iterable[dict[str, Any]], handler: Handler = reraise_exception, *,
    open_stream: OpenStream | None = None,
) -> Iterator[dict[str, Any]]:
    """Samples from CBOR record files (needs ``cbor2``: extra ``cbor``); see the module doc."""
    return _samples(src, handler, open_stream, _cbor_records)


def msgpack_file_samples(
    src: Iterable[dict[str, Any]], handler: Handler = reraise_exception, *,
    open_stream: OpenStream | None = None,
) -> Iterator[dict[str, Any]]:
    """Samples from MessagePack record files (extra ``msgpack``); see the module doc."""
    return _samples(src, handler, open_stream, _msgpack_records)
