"""What a :class:`~wds_cloud.pytorch.WebLoader`'s workers send the main process, and how it
takes it: items packed for the trip (small CPU tensors as their bytes, :class:`_Packed`), each
with its worker's state (:class:`Unship`, :func:`after`, :func:`went_on`), and small items
sent in groups (:func:`grouped`).

torch's DataLoader moves each item on its own: its index down a queue to the worker and the
item back up another, each with a feeder thread. On this project's 2-core machine that took
100-150 µs of the main process's CPU and 50-150 µs of the worker's per item, whatever its
size: more than making a batch of 64 tiny samples costs (``tests/bench/bench_loader.py``). So a
worker whose items come quickly and are small sends several at a time, as one of torch's
items: a :class:`Group`, which the main process takes apart (in the order torch would have
given the items, :meth:`~wds_cloud.dataloader.EpochedLoader._in_turn`).

Layer 3: imports torch only inside what runs with a DataLoader.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["GROUP_BYTES", "GROUP_MAX", "GROUP_SECONDS", "INLINE_TENSOR_BYTES", "Group",
           "Unship", "after", "grouped", "raise_if_error", "went_on"]

#: a group is sent once it holds this many items, ...
GROUP_MAX = 64
#: ... or once its first item would wait this long (seconds) for the next, ...
GROUP_SECONDS = 0.005
#: ... or once its items add up to this many bytes at the size items recently travelled at
#: (an item this large, or of a size not yet known, goes alone)
GROUP_BYTES = 1 << 20


class Group:
    """Consecutive items of one worker (each :class:`~wds_cloud.pipeline.state.Shipped`) sent
    as one item of the DataLoader; ``last``: the worker has no more this pass; ``error``: what
    its dataset raised after those items (torch's ``ExceptionWrapper``, as torch sends it),
    or None."""

    __slots__ = ("error", "items", "last", "worker")

    def __init__(self, items: list[Any], worker: int, last: bool, error: Any = None) -> None:
        self.items = items
        self.worker = worker
        self.last = last
        self.error = error

    def entries(self) -> list[Any]:
        """Its items, then its error if it has one (:func:`raise_if_error` raises it)."""
        return self.items if self.error is None else [*self.items, self.error]


def raise_if_error(entry: Any) -> None:
    """Raise the worker's error that ``entry`` of :meth:`Group.entries` is, if it is one."""
    if hasattr(entry, "reraise"):
        entry.reraise()


class _Sent:
    """The bytes per item of what this worker sent last (0: nothing yet)."""

    per_item = 0


def grouped(items: Iterator[Any], worker: int) -> Iterator[Group]:
    """``items`` (a worker's) in :class:`Group` s: a group goes when it holds
    :data:`GROUP_MAX` items, when its first would wait :data:`GROUP_SECONDS` by the time the
    next came (as long after the last as the last after the one before: slow items go
    alone, at once), or when its items would add up to :data:`GROUP_BYTES`; the last group
    (``last``), perhaps empty, when ``items`` ends, or raises: then with the error, which the
    main process raises after the items before it, where torch would have raised it."""
    group: list[Any] = []
    clock = time.monotonic
    started = last = clock()
    try:
        while True:
            try:
                item = next(items)
            except StopIteration:
                yield Group(group, worker, True)
                return
            except Exception:
                from torch._utils import ExceptionWrapper

                yield Group(group, worker, True, ExceptionWrapper(
                    where=f"in DataLoader worker process {worker}"))
                return
            now = clock()
            gap, last = now - last, now
            if not group:
                started = now
            group.append(item)
            size = _Sent.per_item
            if len(group) >= GROUP_MAX or now + gap - started >= GROUP_SECONDS or not size \
                    or len(group) * size >= GROUP_BYTES:
                yield Group(group, worker, False)
                group = []
    finally:
        close = getattr(items, "close", None)
        if close is not None:
            close()


class Unship:
    """A WebLoader's ``collate_fn`` in its workers: collates the items (sent with their
    worker's state: the batch goes with the state after its last item) and packs the result
    for the trip to the main process (see :class:`_Packed`); a :class:`Group`'s items are
    collated each on its own."""

    def __init__(self, collate: Callable[[Any], Any]) -> None:
        self.collate = collate

    def __call__(self, data: Any) -> Any:
        from .pipeline.state import Shipped

        if isinstance(data, Group):
            data.items = [Shipped(self.collate(d.item), after([d.state])) for d in data.items]
            return _Packed(data)
        if isinstance(data, Shipped):
            return _Packed(Shipped(self.collate(data.item), after([data.state])))
        if isinstance(data, list) and data and isinstance(data[-1], Shipped):
            return _Packed(Shipped(self.collate([d.item for d in data]),
                                   after([d.state for d in data])))
        return _Packed(self.collate(data))


def after(states: list[dict[str, Any]]) -> dict[str, Any]:
    """The state after the last of a batch's items, from the states sent with each (see
    :meth:`~wds_cloud.pipeline.state.ResumeBook.counted`): the last whole state among them
    with the count of items since (``replay``) of the last; for items of slots played
    (:mod:`wds_cloud.pipeline.slots`), that of each slot, under ``played``."""
    if "slot" not in states[-1]:
        return _last_of(states)
    by_slot: dict[int, list[dict[str, Any]]] = {}
    for state in states:
        by_slot.setdefault(int(state["slot"]), []).append(state["state"])
    return {"worker": states[-1]["worker"], "left": states[-1].get("left", -1),
            "played": {slot: _last_of(seq) for slot, seq in by_slot.items()}}


def _last_of(states: list[dict[str, Any]]) -> dict[str, Any]:
    last = states[-1]
    if "replay" not in last:
        return last
    whole = next((s for s in reversed(states) if "replay" not in s), None)
    return last if whole is None else {**whole, "replay": last["replay"], "left": last["left"]}


def went_on(before: dict[str, Any] | None, state: dict[str, Any]) -> dict[str, Any]:
    """A worker's (or slot's) state after ``state`` came: a count of items since the last
    whole state goes with that whole state."""
    if "replay" in state and "fingerprint" not in state:
        return {**(before or {}), "replay": state["replay"], "left": state["left"]}
    return state


#: CPU tensors up to this many bytes travel inside the pickle of their batch
INLINE_TENSOR_BYTES = 64 << 10


class _Sizes:
    """The largest item (in bytes, as it travelled) this process took from a worker since
    :meth:`take` last asked (items of all its loaders: a loader that looks sees at least its
    own)."""

    recent = 0

    @classmethod
    def note(cls, size: int) -> None:
        if size > cls.recent:
            cls.recent = size

    @classmethod
    def take(cls) -> int:
        recent, cls.recent = cls.recent, 0
        return recent


class _Packed:
    """What a WebLoader's worker puts on the DataLoader's queue: ``item``, pickled so that
    small CPU tensors travel as their bytes. torch's own pickling of a tensor for another
    process puts its storage in shared memory and sends a file descriptor through a socket
    connection of its own (with an authentication challenge): about 2 ms per tensor here,
    where a batch of 64 numbers took 17 µs as bytes. Larger tensors go torch's way (one copy
    less). Unpickled in the main process, it is the item itself."""

    __slots__ = ("item",)

    def __init__(self, item: Any) -> None:
        self.item = item

    def __reduce__(self) -> tuple[Any, tuple[bytes, int]]:
        import io

        buffer = io.BytesIO()
        shared: list[int] = []
        _pickler(buffer, shared).dump(self.item)
        data = buffer.getvalue()
        size = len(data) + sum(shared)
        _Sent.per_item = size // len(self.item.items) if isinstance(self.item, Group) \
            and self.item.items else size
        return _unpacked, (data, size)


def _unpacked(data: bytes, size: int = 0) -> Any:
    import pickle

    _Sizes.note(size or len(data))
    return pickle.loads(data)


def _pickler(buffer: Any, shared: list[int] | None = None) -> Any:
    """torch's pickler for another process, with small CPU tensors as their bytes (the bytes
    of the others, which go through shared memory, are added to ``shared``)."""
    import copyreg
    from multiprocessing.reduction import ForkingPickler

    import torch
    import torch.multiprocessing  # registers torch's reducers with ForkingPickler

    pickler = ForkingPickler(buffer, 5)
    table = dict(copyreg.dispatch_table)
    table.update(getattr(ForkingPickler, "_extra_reducers", {}))
    torch_reduce = table.get(torch.Tensor)

    def reduce(tensor: Any) -> Any:
        nbytes = tensor.numel() * tensor.element_size()
        if (type(tensor) is torch.Tensor and tensor.device.type == "cpu"
                and tensor.layout == torch.strided and not tensor.requires_grad
                and not tensor.is_quantized and nbytes <= INLINE_TENSOR_BYTES):
            import ctypes

            dense = tensor.contiguous()
            return _small_tensor, (ctypes.string_at(dense.data_ptr(), nbytes), tensor.dtype,
                                   tuple(tensor.shape))
        if shared is not None:
            shared.append(nbytes)
        if torch_reduce is not None:
            return torch_reduce(tensor)
        return tensor.__reduce_ex__(5)

    table[torch.Tensor] = reduce
    pickler.dispatch_table = table
    return pickler


def _small_tensor(data: bytes, dtype: Any, shape: tuple[int, ...]) -> Any:
    import torch

    if not data:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(data), dtype=dtype).reshape(shape)
