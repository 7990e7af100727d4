"""webdataset's module path ``webdataset.writer``: ``TarWriter``, ``ShardWriter``, the encoders
by extension (``make_handlers``, ``encode_based_on_extension``, ``numpy_dumps``, ...) and
``gopen``, under that one name.

A module of re-exports, not an alias: webdataset kept these together, here the writers live in
:mod:`wds_cloud.tar.writer`, the encoders in :mod:`wds_cloud.codecs.encoder` (with their one
mutable table, ``default_handlers``, which the writers read from there) and ``gopen`` in
:mod:`wds_cloud.router`.
"""

from .codecs.encoder import (
    add_handlers,
    bytestr,
    cbor_dumps,
    default_handlers,
    encode_based_on_extension,
    encode_based_on_extension1,
    imageencoder,
    make_encoder,
    make_handlers,
    mp_dumps,
    numpy_dumps,
    numpy_npz_dumps,
    tenbin_dumps,
    torch_dumps,
)
from .router import gopen
from .tar.writer import ShardWriter, TarWriter

__all__ = [
    "ShardWriter",
    "TarWriter",
    "add_handlers",
    "bytestr",
    "cbor_dumps",
    "default_handlers",
    "encode_based_on_extension",
    "encode_based_on_extension1",
    "gopen",
    "imageencoder",
    "make_encoder",
    "make_handlers",
    "mp_dumps",
    "numpy_dumps",
    "numpy_npz_dumps",
    "tenbin_dumps",
    "torch_dumps",
]
