"""``wds-cloud head URL|SPEC... [-n N]``: the first samples of shards, member by member.

Text members (by extension, or data that decodes as UTF-8 without control characters) are
shown decoded, JSON compact; binary members as their size and a type guessed from their first
bytes (image dimensions, a ``.npy`` array's dtype and shape read from its header). Nothing is
unpickled or decoded beyond that. A shard that cannot be read is named on stderr and skipped
(exit status 1, or 2 if it cannot be found or opened).
"""

from __future__ import annotations

import argparse
import ast
import json
import shutil
import sys
from collections.abc import Callable, Iterator
from typing import Any

from ..errors import WdsCloudError
from ..settings import human_size
from ..urls import redact
from .common import (
    OK,
    Inputs,
    add_input_options,
    add_json_option,
    command_parser,
    count_arg,
    emit_json,
)
from .main import exit_status

__all__ = ["add_parser", "cmd_head", "describe_member"]

#: extensions shown as text whatever their bytes look like (if they decode as UTF-8)
TEXT_EXTENSIONS = frozenset({
    "txt", "text", "cls", "cls2", "caption", "label", "labels", "id", "index", "inx", "key",
    "json", "jsonl", "md", "csv", "tsv", "xml", "html", "yaml", "yml", "url", "uri", "sha256",
})
_TEXT_MAX = 1 << 16  # bytes of data of unknown extension still tried as text
_CONTROL = frozenset(range(32)) - {9, 10, 12, 13}
_PICKLE = frozenset({"pyd", "pickle", "pkl", "pth", "pt", "ckpt"})

_DESCRIPTION = """\
Print the first samples: per sample its key and shard, then each member: text (txt, cls,
json, ... or anything that decodes as UTF-8) decoded, cut to the line width; binary members
as their size and type (JPEG/PNG/GIF images with their dimensions, .npy arrays with dtype and
shape, pickles named but never loaded).

examples:
  wds-cloud head shards/train-000000.tar
  wds-cloud head 's3://bucket/train-{000000..000099}.tar' -n 10 -o anon=true
  wds-cloud head config/train.yaml -n 1 --json"""


def add_parser(sub: Any) -> None:
    p = command_parser(sub, "head", help="print the first samples: keys, text, member types",
                       description=_DESCRIPTION)
    add_input_options(p, what="shards to read")
    p.add_argument("-n", "--samples", type=count_arg(1), default=3, metavar="N",
                   help="samples to print")
    p.add_argument("-w", "--width", type=count_arg(20), default=None, metavar="CHARS",
                   help="characters per output line (default: the terminal's width, or 100)")
    p.add_argument("--max-chars", type=count_arg(0), default=1000, metavar="CHARS",
                   help="characters of a text member kept in --json output (0: all)")
    add_json_option(p)
    p.set_defaults(func=cmd_head)


# -- what a member is ------------------------------------------------------------------------

def _png(data: bytes) -> str:
    if len(data) >= 24:
        return f"PNG image, {int.from_bytes(data[16:20], 'big')}x" \
               f"{int.from_bytes(data[20:24], 'big')}"
    return "PNG image"


def _gif(data: bytes) -> str:
    if len(data) >= 10:
        return f"GIF image, {int.from_bytes(data[6:8], 'little')}x" \
               f"{int.from_bytes(data[8:10], 'little')}"
    return "GIF image"


def _jpeg(data: bytes) -> str:
    """Dimensions from the first start-of-frame segment."""
    i = 2
    while i + 9 <= len(data) and data[i] == 0xFF:
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in (0x01, 0xD8) or 0xD0 <= marker <= 0xD7:  # no length
            i += 2
            continue
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            height = int.from_bytes(data[i + 5:i + 7], "big")
            width = int.from_bytes(data[i + 7:i + 9], "big")
            return f"JPEG image, {width}x{height}"
        i += 2 + int.from_bytes(data[i + 2:i + 4], "big")
    return "JPEG image"


_DTYPES = {"f": "float", "i": "int", "u": "uint", "c": "complex"}


def _npy(data: bytes) -> str:
    """dtype and shape from the header of a ``.npy`` file (never loads the array)."""
    try:
        start = 10 if data[6] == 1 else 12
        length = int.from_bytes(data[8:start], "little")
        header = ast.literal_eval(data[start:start + length].decode("latin1"))
        descr, shape = header["descr"], tuple(header["shape"])
    except (ValueError, SyntaxError, KeyError, IndexError, TypeError, MemoryError):
        return "numpy array (unreadable header)"
    if isinstance(descr, str) and len(descr) >= 3 and descr[1] in _DTYPES \
            and descr[2:].isdigit():
        descr = f"{_DTYPES[descr[1]]}{8 * int(descr[2:])}"
    elif descr in ("|b1", "?"):
        descr = "bool"
    return f"numpy array, {descr}, shape {shape}"


def _pickle(data: bytes) -> str:
    return f"pickle (protocol {data[1]}; not loaded)"


#: (magic at offset 0, how to describe it) in the order tried
_MAGIC: tuple[tuple[bytes, Callable[[bytes], str]], ...] = (
    (b"\xff\xd8\xff", _jpeg), (b"\x89PNG\r\n\x1a\n", _png), (b"GIF87a", _gif),
    (b"GIF89a", _gif), (b"\x93NUMPY", _npy), (b"%PDF", lambda d: "PDF document"),
    (b"II*\0", lambda d: "TIFF image"), (b"MM\0*", lambda d: "TIFF image"),
    (b"fLaC", lambda d: "FLAC audio"), (b"OggS", lambda d: "Ogg media"),
    (b"ID3", lambda d: "MP3 audio"), (b"\x1aE\xdf\xa3", lambda d: "Matroska/WebM video"),
    (b"\x1f\x8b", lambda d: "gzip data"), (b"\xfd7zXZ\0", lambda d: "xz data"),
    (b"\x28\xb5\x2f\xfd", lambda d: "zstd data"),
)


def _binary_type(ext: str, data: bytes) -> str:
    for magic, describe in _MAGIC:
        if data.startswith(magic):
            return describe(data)
    if data[:4] == b"RIFF" and data[8:12] in (b"WEBP", b"WAVE", b"AVI "):
        return {b"WEBP": "WebP image", b"WAVE": "WAV audio", b"AVI ": "AVI video"}[data[8:12]]
    if data[4:8] == b"ftyp":
        return "MP4/QuickTime media"
    if data[:4] == b"PK\x03\x04":
        return "PyTorch file (zip; not loaded)" if ext in _PICKLE else "zip archive"
    if len(data) > 2 and data[0] == 0x80 and 2 <= data[1] <= 5:
        return _pickle(data)
    named = {"ten": "tenbin arrays", "mp": "MessagePack", "msgpack": "MessagePack",
             "cbor": "CBOR", "bmp": "BMP image", "webp": "WebP image"}
    if ext in _PICKLE:
        return "pickle (not loaded)"
    return named.get(ext, "binary data")


def _as_text(ext: str, data: bytes) -> str | None:
    """The member decoded, if it is text; None if it is binary."""
    if ext not in TEXT_EXTENSIONS and (len(data) > _TEXT_MAX or _CONTROL & set(data)):
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if ext == "json":
        try:
            return json.dumps(json.loads(text), ensure_ascii=False, separators=(", ", ": "))
        except ValueError:
            return text
    return text


def describe_member(ext: str, data: bytes) -> str | dict[str, Any]:
    """A member as ``head`` shows it: its text (a ``.json`` member re-serialized compactly),
    or ``{"size": bytes, "type": "JPEG image, 640x480"}``. ``ext``: the member's extension."""
    last = ext.rsplit(".", 1)[-1].lower()
    if not any(data.startswith(magic) for magic, _ in _MAGIC):
        text = _as_text(last, data)
        if text is not None:
            return text
    return {"size": len(data), "type": _binary_type(last, data)}


# -- output ----------------------------------------------------------------------------------

def _cut(text: str, limit: int) -> str:
    return text if limit <= 0 or len(text) <= limit else text[:max(limit - 3, 0)] + "..."


def _members(sample: dict[str, Any]) -> Iterator[tuple[str, bytes]]:
    for ext, value in sample.items():
        if not ext.startswith("__") and isinstance(value, (bytes, bytearray)):
            yield ext, bytes(value)


def _print_sample(n: int, sample: dict[str, Any], source: str | None, width: int) -> None:
    origin = redact(str(sample.get("__url__", "?")))
    if source is not None:
        origin += f" (source {source!r})"
    print(f"#{n} key {sample.get('__key__')!r} from {origin}")
    members = list(_members(sample))
    if not members:
        print("  (no members)")
    ext_width = max((len(ext) for ext, _ in members), default=0)
    size_width = max((len(human_size(len(data))) for _, data in members), default=0)
    for ext, data in members:
        shown = describe_member(ext, data)
        size = human_size(len(data))
        if isinstance(shown, str):
            what = shown if ext.rsplit(".", 1)[-1].lower() == "json" else \
                json.dumps(shown, ensure_ascii=False)
        else:
            what = shown["type"]
        line = f"  {ext:<{ext_width}}  {size:>{size_width}}  {what}"
        print(_cut(line, width))


def cmd_head(args: argparse.Namespace) -> int:
    inputs = Inputs.from_args(args)
    shards = inputs.shards()
    sources = {s.url: s.source for s in shards}
    width = args.width or (shutil.get_terminal_size((100, 24)).columns
                           if sys.stdout.isatty() else 100)
    found: list[dict[str, Any]] = []
    errors: list[WdsCloudError] = []

    def handler(exc: BaseException) -> bool:
        """A shard that cannot be read: named on stderr, then the next one."""
        if not isinstance(exc, WdsCloudError):
            raise exc
        errors.append(exc)
        print(f"wds-cloud head: error: {exc}", file=sys.stderr)
        return True

    samples = inputs.samples(shards, handler=handler)
    try:
        for n, sample in enumerate(samples, 1):
            source = sources.get(str(sample.get("__url__")))
            if args.json:
                members = {ext: _cut(v, args.max_chars) if isinstance(v, str) else v
                           for ext, data in _members(sample)
                           for v in [describe_member(ext, data)]}
                found.append({"key": sample.get("__key__"),
                              "url": redact(str(sample.get("__url__"))),
                              "source": source, "members": members})
            else:
                if n > 1:
                    print()
                _print_sample(n, sample, source, width)
            if n >= args.samples:
                break
    finally:
        close = getattr(samples, "close", None)
        if close is not None:
            close()
    if args.json:
        emit_json({"samples": found})
    return max((exit_status(e) for e in errors), default=OK)
