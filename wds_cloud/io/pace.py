"""Whether pre-reading pays: the pace of a consumer's reads from its shards' connections.

:class:`~wds_cloud.io.readahead.ReadAhead` times each read its consumer makes from a shard's
connection after the pre-read bytes, and tells a :class:`Pace`, which judges them by every
:data:`WINDOW` bytes:

- at :data:`FAST_READS` or faster, the connections keep up with their consumer: pre-reading
  would only copy their bytes once more, in threads that take the GIL from the consumer (from
  nginx on loopback, pre-reading every shard took 1.5 times the CPU per GB, and was slower:
  by 10% on 16 MiB shards, by a third on 4 MiB ones);
- slower :data:`SLOW_WINDOWS` times in a row, the consumer waits for its connection: shards
  read on many connections at once come faster (where a store serves each connection at its
  own rate, 50 MB/s: twice as fast). A window in which read-ahead threads were pre-reading
  does not count as slow: the consumer may have waited for the GIL, not for its connection.

Pre-reading starts once it pays, not before: a shard no larger than its share of the budget
is pre-read whole, and its reads could never show that pre-reading does not pay. A consumer of
the same links later (the next epoch) starts where :attr:`Pace.verdict` says: pre-reading if
its reads turned it on, or it was on for most of them. Not the last window's word, nor most
windows': over a link slow per connection, a shard whose bytes waited in the kernel's buffers
while the one before was read comes fast, yet pre-reading pays there.

This module is layer-neutral: standard library only.
"""

from __future__ import annotations

__all__ = ["FAST_READS", "SLOW_WINDOWS", "WINDOW", "Pace"]

#: reads that come at least this fast (bytes per second) keep up with their consumer
FAST_READS = 512 << 20
WINDOW = 2 << 20  # reads are judged by this many bytes at a time
SLOW_WINDOWS = 2  # slow windows in a row that make pre-reading pay


class Pace:
    """The judge of one consumer's reads; ``pays``: whether pre-reading pays, until the reads
    show otherwise (by default not: see the module doc). Used by the consumer's thread
    only."""

    def __init__(self, *, pays: bool = False) -> None:
        self.pays = pays
        self._bytes = 0
        self._seconds = 0.0
        self._slow = 0  # slow windows in a row, none of them with pre-reading going on
        self._busy = False  # pre-reading went on during the current window
        self._turned_on = False  # the reads turned pre-reading on
        self._windows = [0, 0]  # windows judged with pre-reading off, and on

    def note(self, nbytes: int, seconds: float, *, prereading: bool) -> bool:
        """The consumer read ``nbytes`` in ``seconds`` (``prereading``: while read-ahead
        threads were pre-reading); whether ``pays`` changed."""
        self._bytes += nbytes
        self._seconds += seconds
        self._busy = self._busy or prereading
        if self._bytes < WINDOW:
            return False
        keeps_up = self._bytes >= FAST_READS * self._seconds
        self._windows[self.pays] += 1
        self._slow = 0 if keeps_up else self._slow + (not self._busy)
        self._bytes, self._seconds, self._busy = 0, 0.0, prereading
        if keeps_up:
            pays = False
        elif self._slow >= SLOW_WINDOWS:
            pays = True
        else:
            return False
        changed, self.pays = pays != self.pays, pays
        self._turned_on = self._turned_on or (changed and pays)
        return changed

    @property
    def verdict(self) -> bool:
        """Whether a consumer of the same links should start pre-reading: the reads turned it
        on, or it was on for most windows (as given, before any)."""
        off, on = self._windows
        return self._turned_on or (on > off if off + on else self.pays)
