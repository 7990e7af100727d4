"""Plain tar members parsed straight out of a buffer: the reader's path for small members.

:func:`fast_batch` walks consecutive plain members (a type ``0`` header without ustar prefix,
optionally after one pax or GNU long-name header) whose data is in the buffer. The first are
parsed one by one; when they are small, the rest of the buffer is walked with numpy in one
pass. numpy is imported on first use only, so a process that never meets small members (or
never reads a tar) does not pay for it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .header import BLOCK, pax_overrides

__all__ = ["READ_AT_MIN", "Far", "Member", "fast_batch", "fast_extended"]

Member = tuple[str, "bytes | memoryview"]  # bytes, or views of a mapped file (zero-copy)
#: reads member data out of the file rather than the buffer: ``(size, offset)`` (the offset in
#: the file, from where reading began) -> the data, None where the file holds less than the
#: data and its padding (the general path then reports the damage)
Far = Callable[[int, int], "bytes | None"]

READ_AT_MIN = 1 << 16  # members this large are read with ``far`` when there is one

_PROBE = 32  # members parsed one by one before deciding whether to vectorize
_DENSE_BLOCKS = 16  # vectorize when those members take at most this many blocks on average


def fast_batch(buf: Any, pos: int, *, vectorize: bool = True, far: Far | None = None,
               view: memoryview | None = None, base: int = 0,
               ) -> tuple[list[Member], list[int], list[int], int, int]:
    """Parse consecutive plain members from ``pos``: a type ``0`` header without ustar prefix
    (optionally after one pax or GNU long-name header) in ``buf`` (``bytes``), data buffered.
    ``far``, when given, reads member data out of the file instead (``buf[0]`` is at offset
    ``base`` in it): that of members of :data:`READ_AT_MIN` bytes or more, and of those whose
    data runs past the buffer; ``view``, when given (a view of the whole file), is what every
    member's data is sliced out of (zero-copy). Either way the walk goes on past the buffer's
    end, to the next header.

    Returns the members, their header offsets in ``buf``, the offsets of the extended headers
    before them (checksums still unverified), where it stopped (in ``buf``'s coordinates;
    past its end after a member read with ``far``) and the bytes of the large members'
    data (what a buffer of headers and small members need not hold). The first members are
    parsed one by one; if they are small and ``vectorize``, the rest of the buffer is walked
    with numpy.
    """
    members: list[Member] = []
    headers: list[int] = []
    extended: list[int] = []
    start = pos
    pos, large = _walk(buf, pos, members, headers, extended, _PROBE, far, view, base)
    if vectorize and len(members) == _PROBE and pos - start <= _PROBE * _DENSE_BLOCKS * BLOCK:
        pos = _walk_dense(buf, pos, members, headers, extended, view, base)
    elif len(members) < _PROBE:  # the walk stopped before its count: it would stop again
        return members, headers, extended, pos, large
    pos, more = _walk(buf, pos, members, headers, extended, len(buf), far, view, base)
    return members, headers, extended, pos, large + more


def _walk(buf: Any, pos: int, members: list[Member], headers: list[int], extended: list[int],
          count: int, far: Far | None = None, view: memoryview | None = None, base: int = 0,
          ) -> tuple[int, int]:
    """Append up to ``count`` plain members from ``pos`` whose headers are buffered; return
    where it stopped and the bytes of large members' data."""
    add, mark, find = members.append, headers.append, buf.find
    end = len(buf)
    limit = end - BLOCK
    beyond = far is not None or view is not None  # data past the buffer can be read
    room = len(view) - base if view is not None else 0  # the file's end, in buf's terms
    large = 0
    for _ in range(count):
        if pos > limit:
            break
        start = pos
        name = size = None
        if buf[pos + 156] != 48:
            ext = fast_extended(buf, pos, limit)
            if ext is None:
                break
            pos, name, size = ext
            if buf[pos + 156] != 48:
                pos = start
                break
        if buf[pos + 135] or (buf[pos + 345] and name is None):
            pos = start
            break
        try:
            header_size = int(buf[pos + 124:pos + 135], 8)
        except ValueError:
            pos = start
            break
        size = header_size if size is None else size
        data = pos + BLOCK
        nxt = data + ((size + 511) & -512)
        if size < 0 or header_size < 0 or (nxt > end and not beyond):
            pos = start
            break
        if name is None:
            nul = find(b"\0", pos, pos + 100)
            name = buf[pos:nul if nul >= 0 else pos + 100].decode("utf-8", "surrogateescape")
        if view is not None:
            if nxt > room:  # (the file holds less than its data and padding)
                pos = start
                break
            add((name, view[base + data:base + data + size]))
        elif far is not None and (nxt > end or size >= READ_AT_MIN):
            piece = far(size, base + data)
            if piece is None:
                pos = start
                break
            add((name, piece))
        else:
            add((name, buf[data:data + size]))
        mark(pos)
        if start != pos:
            extended.append(start)
        if size >= READ_AT_MIN:
            large += size
        pos = nxt
    return pos, large


def _walk_dense(buf: Any, pos: int, members: list[Member], headers: list[int],
                extended: list[int], view: memoryview | None = None, base: int = 0) -> int:
    """:func:`_walk` vectorized: every block from ``pos`` is parsed as if it were a plain
    header in one numpy pass; the chain of next-header indexes from the first block is then
    verified in one more pass for as long as it runs through plain headers only (a data block
    that looks like a header breaks it there), and Python follows it from where that stops."""
    import numpy as np  # only shards of small members pay for it

    window = len(buf)
    nblocks = (window - pos) // BLOCK
    rows = np.frombuffer(buf, np.uint8, nblocks * BLOCK, pos).reshape(nblocks, BLOCK)
    # only blocks that look like plain headers by three bytes are parsed further (data blocks
    # of small members are most of the buffer, and few of them pass)
    cand = np.flatnonzero((rows[:, 156] == 48) & (rows[:, 135] == 0) & (rows[:, 345] == 0))
    digits = rows[cand, 124:135].astype(np.int64) - 48
    valid = ((digits >= 0) & (digits <= 7)).all(axis=1)
    found_sizes = digits @ (8 ** np.arange(10, -1, -1, dtype=np.int64))  # octal digit weights
    ends = cand + 1 + ((found_sizes + 511) >> 9)
    sizes = np.zeros(nblocks, np.int64)
    sizes[cand] = found_sizes
    plain = np.zeros(nblocks, bool)
    plain[cand] = valid
    nxt = np.full(nblocks, -1, np.int64)
    nxt[cand] = np.where(valid & (ends <= nblocks), ends, -1)
    chain, i = _plain_chain(np, nxt)
    found: list[int] = []
    overrides: dict[int, tuple[str | None, int | None]] = {}
    if i < nblocks and (nxt[i] >= 0 or fast_extended(buf, pos + i * BLOCK, window - BLOCK)):
        i = _follow(buf, pos, nxt.tolist(), plain.tolist(), i, found, overrides, extended,
                    window)
    if len(chain) or found:
        idx = np.concatenate((chain, np.array(found, dtype=np.intp))) if found else chain
        headers.extend(_collect(buf, pos, rows, sizes, idx, overrides, members, view, base))
    return pos + i * BLOCK


def _plain_chain(np: Any, nxt: Any) -> tuple[Any, int]:
    """The blocks of the chain of plain headers from block 0 (``nxt``: each block's next
    header, -1 if it is no plain header or its data is not buffered), as an array, and the
    block after them."""
    heads = np.flatnonzero(nxt >= 0)
    if not len(heads) or heads[0]:
        return heads[:0], 0
    broken = np.flatnonzero(nxt[heads[:-1]] != heads[1:])
    last = int(broken[0]) if len(broken) else len(heads) - 1
    return heads[:last + 1], int(nxt[heads[last]])


def _follow(buf: Any, pos: int, links: list[int], is_plain: list[bool], i: int,
            found: list[int], overrides: dict[int, tuple[str | None, int | None]],
            extended: list[int], window: int) -> int:
    """Follow the chain of headers from block ``i`` one by one (through pax and long-name
    headers too), appending the member header blocks to ``found``; return where it stops."""
    nblocks = len(links)
    while i < nblocks:
        j = links[i]
        if j < 0:  # not a plain member: maybe a pax/long-name header before one
            ext = fast_extended(buf, pos + i * BLOCK, window - BLOCK)
            if ext is None:
                break
            k = (ext[0] - pos) // BLOCK
            j = links[k] if ext[2] is None else k + 1 + ((ext[2] + 511) >> 9)
            if not is_plain[k] or not 0 < j <= nblocks or (ext[2] or 0) < 0:
                break
            if ext[1] is not None or ext[2] is not None:
                overrides[k] = ext[1:]
            extended.append(pos + i * BLOCK)
            i = k
        found.append(i)
        i = j
    return i


def _collect(buf: Any, pos: int, rows: Any, sizes: Any, idx: Any,
             overrides: dict[int, tuple[str | None, int | None]], members: list[Member],
             view: memoryview | None = None, base: int = 0) -> list[int]:
    """Append the members whose headers are the blocks ``idx`` (relative to ``pos``), their
    data sliced out of ``buf`` (or out of ``view``, the file from offset ``-base``); return the
    offsets of those headers in ``buf``."""
    import numpy as np

    # the names, NUL-terminated, decoded in one piece and split: as decoding each alone (a
    # NUL is never part of a UTF-8 sequence, so the escapes of bad bytes are the same)
    field = rows[idx, :101].copy()
    field[:, 100] = 0  # a name of 100 bytes has no NUL of its own
    lengths = (field == 0).argmax(axis=1)
    keep = np.arange(101) <= lengths[:, None]
    names = field[keep].tobytes().decode("utf-8", "surrogateescape").split("\0")[:-1]
    starts = (idx * BLOCK + pos).tolist()
    lens = sizes[idx].tolist()
    if overrides:
        for n, k in enumerate(idx.tolist()):
            if k in overrides:
                name, size = overrides[k]
                names[n] = names[n] if name is None else name
                lens[n] = lens[n] if size is None else size
    source, at = (buf, BLOCK) if view is None else (view, base + BLOCK)
    datas = [source[at + p:at + p + n] for p, n in zip(starts, lens, strict=True)]
    members.extend(zip(names, datas, strict=True))
    return starts


def fast_extended(buf: Any, pos: int, limit: int) -> tuple[int, str | None, int | None] | None:
    """A buffered pax (``x``) or GNU long-name (``L``) header at ``pos`` whose member header is
    buffered too: ``(member header offset, name or None, size or None)``; None otherwise."""
    kind = buf[pos + 156]
    if (kind != 120 and kind != 76) or buf[pos + 135]:
        return None
    try:
        size = int(buf[pos + 124:pos + 135], 8)
    except ValueError:
        return None
    nxt = pos + BLOCK + ((size + 511) & -512)
    if size < 0 or nxt > limit:
        return None
    data = buf[pos + BLOCK:pos + BLOCK + size]
    if kind == 76:
        nul = data.find(b"\0")
        return nxt, data[:nul if nul >= 0 else size].decode("utf-8", "surrogateescape"), None
    try:
        return (nxt, *pax_overrides(data))
    except ValueError:
        return None  # the general path reports it
