"""The stages of a pipeline as a resumable state sees them, and which changes between a save and
a restore are honoured (:func:`check_stages`).

A state records its pipeline's stages as one string, ``describe_stages(stages)``: each stage's
kind, with the size of those whose size matters to a restore (``shuffle:50``,
``batched:10``). Restoring into a pipeline whose stages differ:

- **honoured** (logged once at INFO): a changed batch size (``batched``, ``listed``: the same
  sample stream is batched anew from the next sample), a changed shuffle buffer size or a
  shuffle added (the samples of the buffer are restored, then the rest of the epoch is read
  once, in the new buffer's order), and any stage that keeps no state added, removed or
  changed (``map``, ``decode``, ``to_tuple``, ``select``, ``rename``, ...: they see each
  sample once, as before);
- **refused** in ``load_state_dict`` with :class:`~wds_cloud.errors.ResumeError` naming the
  stage (``field="stages"``): a shuffle removed while the state holds its buffer (its samples
  would be lost), and any other stateful stage added, removed or changed (``slice``,
  ``unbatched``, ``rsample``, a source). A WebLoader's state (each worker's last full state
  plus the items yielded since, which a restore replays through the stages) honours only
  changes of stages that give one item per item (``map``, ``decode``, ``to_tuple``, ...).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

from ..errors import ResumeError

__all__ = ["check_stages", "describe_stages"]

#: stages that see each sample once and keep nothing between samples
STATELESS = frozenset({
    "map", "map_dict", "map_tuple", "decode", "xdecode", "to_tuple", "rename",
    "rename_keys", "extract_keys", "select", "log_keys", "check_empty", "lambda",
})
#: stateless stages that give exactly one item per item (a replay goes through them alike)
ONE_TO_ONE = STATELESS - {"select", "lambda"}
#: stages whose size a restore honours when it changes
RESIZABLE = frozenset({"batched", "listed", "shuffle"})
_SHUFFLES = {"ReaderShuffle", "SpecShuffle", "shuffle"}
_ALIASES = {"islice": "slice"}  # the function behind a fluid method of another name


def _kind(stage: Any) -> str:
    """``kind`` or ``kind:size`` of one stage."""
    f = getattr(stage, "f", None)
    name = type(stage).__name__
    if name == "stage" and f is not None:
        name = _ALIASES.get(getattr(f, "__name__", name), getattr(f, "__name__", name))
        name = name.lstrip("_")
        args, kw = getattr(stage, "args", ()), getattr(stage, "kw", {})
        if name in RESIZABLE:
            size = args[0] if args else kw.get("batchsize", kw.get("bufsize"))
            return f"{name}:{size}"
        return name
    if name in _SHUFFLES:
        return f"shuffle:{getattr(stage, 'bufsize', '?')}"
    if isinstance(stage, functools.partial):
        return getattr(stage.func, "__name__", "partial").lstrip("_")
    if name == "function":
        return getattr(stage, "__name__", name).lstrip("_").replace("<lambda>", "lambda")
    return name


def describe_stages(stages: Iterable[Any]) -> str:
    """The stages as a state records them (see the module docstring)."""
    return ",".join(_kind(stage) for stage in stages)


def _stateful(described: str) -> list[str]:
    return [k for k in described.split(",") if k and k.split(":")[0] not in STATELESS]


def _name(kind: str) -> str:
    base, _, size = kind.partition(":")
    return f".{base}({size})" if size else f".{base}()" if base[:1].islower() else base


def _base(kind: str) -> str:
    return kind.split(":")[0]


def check_stages(saved: str, now: str, *, buffered: bool, replayed: bool = False) -> list[str]:
    """What changed between the ``saved`` stages and ``now`` (honoured changes, as lines to
    log); :class:`ResumeError` for a change that cannot be honoured. ``buffered``: the state
    holds a shuffle buffer; ``replayed``: it is a WebLoader worker's, whose last items are
    replayed through the stages (so only stages that give one item per item may change)."""
    if saved == now:
        return []
    if replayed:
        changed = [k for k in (*saved.split(","), *now.split(","))
                   if saved.split(",").count(k) != now.split(",").count(k)]
        if any(_base(k) not in ONE_TO_ONE for k in changed):
            first = next(k for k in changed if _base(k) not in ONE_TO_ONE)
            raise ResumeError(
                f"cannot resume: {_name(first)} changed since the state was saved, and a "
                "WebLoader's state is each worker's last full state plus the items it yielded "
                "since, replayed through the same stages; resume with the saved stages (batch "
                "and shuffle sizes can change when a dataset's own state_dict() is restored "
                "in one process)", field="stages")
    old, new = _stateful(saved), _stateful(now)
    old_shuffles = [k for k in old if _base(k) == "shuffle"]
    new_shuffles = [k for k in new if _base(k) == "shuffle"]
    if len(old_shuffles) > len(new_shuffles) and buffered:
        raise ResumeError(
            f"cannot resume: the state holds the buffer of {_name(old_shuffles[-1])}, which "
            "this pipeline no longer has (its samples would be lost); keep a .shuffle()",
            field="stages")
    rest_old = [k for k in old if _base(k) != "shuffle"]
    rest_new = [k for k in new if _base(k) != "shuffle"]
    if [_base(k) for k in rest_old] != [_base(k) for k in rest_new]:
        first = next(a or b for a, b in _pairs(rest_old, rest_new) if _base(a) != _base(b))
        shown_old, shown_new = _tails(old, new)
        raise ResumeError(
            f"cannot resume: the pipeline's stages changed since the state was saved (saved "
            f"{_list(shown_old)}, now {_list(shown_new)}; first difference at {_name(first)}):"
            " only batch "
            "sizes, shuffle buffer sizes, an added shuffle and stages that keep no state (map, "
            "decode, to_tuple, select, ...) may change", field="stages")
    notes = []
    for a, b in zip(rest_old, rest_new, strict=True):
        if a != b:
            if _base(a) not in RESIZABLE:
                raise ResumeError(f"cannot resume: {_name(a)} is now {_name(b)} (only batch and "
                                  "shuffle buffer sizes may change)", field="stages")
            notes.append(f"{_name(a)} is now {_name(b)}: the same samples are batched anew")
    if old_shuffles != new_shuffles:
        notes.append(f"shuffle {_list(old_shuffles)} is now {_list(new_shuffles)}: the rest of "
                     "the epoch is read once, in the new buffer's order")
    if [k for k in saved.split(",") if _base(k) in STATELESS] != \
            [k for k in now.split(",") if _base(k) in STATELESS]:
        notes.append("stages that keep no state changed: the same samples go through them")
    return notes


def _pairs(old: list[str], new: list[str]) -> list[tuple[str, str]]:
    n = max(len(old), len(new))
    return [(old[i] if i < len(old) else "", new[i] if i < len(new) else "") for i in range(n)]


def _list(kinds: list[str]) -> str:
    return " ".join(_name(k) for k in kinds) or "none"


def _tails(old: list[str], new: list[str]) -> tuple[list[str], list[str]]:
    """``old`` and ``new`` without the stages they start with alike (the source's)."""
    n = 0
    while n < min(len(old), len(new)) and old[n] == new[n] and not old[n][:1].islower():
        n += 1
    return old[n:], new[n:]
