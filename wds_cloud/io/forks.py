"""What a forked child (a DataLoader worker) must not inherit from its parent's other threads.

A child has only the thread that forked. A lock that another thread of the parent held at that
moment comes over held, with no thread to let it go, and the child's first use of it waits
forever. Every one of these was seen with the parent reading in a thread (read-ahead, a cache
fill, a monitor polling ``io_stats()``) while a ``WebLoader`` started its workers:

- :class:`ForkSafeLock`: a lock for process-wide state that a child gets anew;
- :class:`once`: ``functools.cached_property`` without the lock Python 3.11's holds for every
  instance of the class while one computes (3.12 dropped it);
- :func:`settle_imports`: waits, before workers are forked, for the imports other threads have
  under way (a module's import lock comes over held in the same way).

Nothing happens at import: a lock's fork hook is registered at its first use.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar, overload

__all__ = ["ForkSafeLock", "once", "settle_imports"]

_T = TypeVar("_T")


class ForkSafeLock:
    """``with lock:`` as with a ``threading.Lock``; a child forked while another thread held
    it starts with a new one. (Never held across a fork by the forking thread itself.)"""

    __slots__ = ("_hooked", "_lock")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._hooked = False

    def __enter__(self) -> None:
        if not self._hooked:
            self._hooked = True
            os.register_at_fork(after_in_child=self._renew)
        self._lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self._lock.release()

    def _renew(self) -> None:
        self._lock = threading.Lock()


class once(Generic[_T]):  # a decorator, named like functools.cached_property
    """A property computed on first use and kept in the instance's ``__dict__``, as
    ``functools.cached_property``, without its lock (see the module doc). Threads that
    compute at once keep the value stored first."""

    def __init__(self, func: Callable[[Any], _T]) -> None:
        self.func, self.name, self.__doc__ = func, func.__name__, func.__doc__

    @overload
    def __get__(self, instance: None, owner: type | None = None) -> once[_T]: ...

    @overload
    def __get__(self, instance: object, owner: type | None = None) -> _T: ...

    def __get__(self, instance: object | None, owner: type | None = None) -> Any:
        if instance is None:
            return self
        kept = instance.__dict__
        if self.name not in kept:
            kept.setdefault(self.name, self.func(instance))
        return kept[self.name]


def settle_imports() -> None:
    """Wait for the imports other threads have under way (a dataset read in a thread of this
    process, whose first shard imports the cache or a store's SDK) before workers are forked:
    a child forked in the middle inherits the module's import lock held, and waits forever at
    its own first import of that module."""
    for name, module in list(sys.modules.items()):
        if getattr(getattr(module, "__spec__", None), "_initializing", False):
            with contextlib.suppress(Exception):  # the importing thread reports its own error
                importlib.import_module(name)
