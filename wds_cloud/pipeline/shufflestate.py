"""The resumable shuffle buffer: :class:`ResumableShuffle`, whose buffer is saved as
references to its samples (see :mod:`wds_cloud.pipeline.state`) and refetched on a restore."""

from __future__ import annotations

import base64
import struct
from collections.abc import Iterable, Iterator
from typing import Any

from .filters import check_bufsize
from .state import RefSource, ResumeBook, State, decode_refs

__all__ = ["ResumableShuffle"]


class ResumableShuffle:
    """A buffer shuffle whose buffer and draws can be saved and restored.

    The same stream as :func:`~wds_cloud.pipeline.filters.buffer_shuffle` (for the same
    ``rng``): growing, two samples in for one out until ``bufsize``, first output after
    ``initial``; then one in, one out; at the end the rest, shuffled. ``source`` gives the
    reference of each sample as it comes in, and refetches references on a restore.
    """

    def __init__(self, book: ResumeBook, source: RefSource, bufsize: int,
                 initial: int = 100) -> None:
        self.book = book
        self.source = source
        self.bufsize = check_bufsize(bufsize)
        self.initial = min(initial, bufsize)

    def run(self, src: Iterable[Any], rng: Any) -> Iterator[Any]:
        """Shuffle ``src`` drawing from ``rng`` (a KeyedRandom of this iteration).

        The references are kept packed, 32 bytes a slot in buffer order, so that a state
        (taken after every batch a DataLoader worker sends) costs one copy, not a loop."""
        book, source = self.book, self.source
        bufsize, initial = self.bufsize, self.initial
        buf: list[Any] = []
        packed = bytearray(_REF_BYTES * bufsize)
        head = [0, 0]  # the tail's next slot; the phase (0: filling and running, 1: the tail)
        saved = book.get("shuffle.buffer")
        if saved is not None:
            rng.skip(int(book.get("shuffle.draws", 0)))
            refs = decode_refs(saved)
            buf = source.refetch(refs)
            packed[:len(refs) * _REF_BYTES] = base64.b64decode(saved)
            head[1] = int(book.get("shuffle.phase", 0))

        def state() -> State:
            import numpy as np

            used = memoryview(packed)[head[0] * _REF_BYTES:len(buf) * _REF_BYTES]
            out: State = {"shuffle.draws": rng.draws, "shuffle.phase": head[1],
                          "shuffle.buffer": base64.b64encode(used).decode("ascii")}
            rows = np.frombuffer(used, dtype="<i8").reshape(-1, 4)
            for pair in np.unique((rows[:, 0] << 40) | rows[:, 1]).tolist():
                i, k = pair >> 40, pair & ((1 << 40) - 1)
                history = book.histories.get(i)
                url = history().get(k) if history is not None else None
                out[f"ref.{i}.{k}"] = url if url is not None else book.get(f"ref.{i}.{k}", "")
            return out

        book.part("shuffle", state)
        rand, it, pack, last = rng.random, iter(src), _PACK.pack_into, source.last_ref
        if head[1] == 0:
            for sample in it:
                if len(buf) < bufsize:
                    pack(packed, len(buf) * _REF_BYTES, *last())
                    buf.append(sample)
                    if len(buf) < bufsize:
                        extra = next(it, _END)
                        if extra is not _END:
                            pack(packed, len(buf) * _REF_BYTES, *last())
                            buf.append(extra)
                    if len(buf) < initial:
                        continue
                    k, n = int(rand() * len(buf)), len(buf) - 1
                    buf[k], buf[-1] = buf[-1], buf[k]
                    a, b = k * _REF_BYTES, n * _REF_BYTES
                    packed[a:a + _REF_BYTES], packed[b:b + _REF_BYTES] = \
                        packed[b:b + _REF_BYTES], packed[a:a + _REF_BYTES]
                    yield buf.pop()
                else:
                    k = int(rand() * bufsize)
                    out, buf[k] = buf[k], sample
                    pack(packed, k * _REF_BYTES, *last())
                    yield out
            order = list(range(len(buf)))
            rng.shuffle(order)
            buf = [buf[i] for i in order]
            packed[:len(order) * _REF_BYTES] = b"".join(
                packed[i * _REF_BYTES:(i + 1) * _REF_BYTES] for i in order)
            head[1] = 1
        while head[0] < len(buf):
            out, buf[head[0]] = buf[head[0]], None
            head[0] += 1
            yield out


_REF_BYTES = 32
_PACK = struct.Struct("<qqqq")
_END: Any = object()
