"""L2 tar shards: header parsing, compression, the streaming member reader, grouping members into
samples, and TarWriter/ShardWriter.

The writers are imported on first use: they bring the encoders (and numpy), which reading
shards does not need.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .compress import (
    CHUNK_SIZE,
    Decompressed,
    compression_for,
    compressor,
    tar_source,
)
from .header import (
    BLOCK,
    FORMATS,
    RECORD,
    HeaderBuilder,
    checksum_ok,
    first_bad_header,
    header_name,
    padded,
    padding,
    parse_number,
    parse_pax,
    pax_overrides,
    unsigned_sum,
)
from .reader import DIRECT_MIN, Member, iter_member_batches
from .samples import (
    base_plus_ext,
    group_by_keys,
    meta_prefix,
    meta_suffix,
    open_shards,
    tar_file_expander,
    tar_file_iterator,
    valid_sample,
)
from .shardloop import ShardCursor, samples_from_shards

if TYPE_CHECKING:
    from .writer import ShardWriter, TarWriter, numpy_dumps, torch_dumps

_WRITER = frozenset({"ShardWriter", "TarWriter", "numpy_dumps", "torch_dumps"})


def __getattr__(name: str) -> Any:
    if name in _WRITER:
        from . import writer

        return getattr(writer, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "BLOCK",
    "CHUNK_SIZE",
    "DIRECT_MIN",
    "FORMATS",
    "RECORD",
    "Decompressed",
    "HeaderBuilder",
    "Member",
    "ShardCursor",
    "ShardWriter",
    "TarWriter",
    "base_plus_ext",
    "checksum_ok",
    "compression_for",
    "compressor",
    "first_bad_header",
    "group_by_keys",
    "header_name",
    "iter_member_batches",
    "meta_prefix",
    "meta_suffix",
    "numpy_dumps",
    "open_shards",
    "padded",
    "padding",
    "parse_number",
    "parse_pax",
    "pax_overrides",
    "samples_from_shards",
    "tar_file_expander",
    "tar_file_iterator",
    "tar_source",
    "torch_dumps",
    "unsigned_sum",
    "valid_sample",
]
