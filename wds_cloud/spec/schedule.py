"""Weight schedules: a source's weight as a function of how far training has gone.

``weight: {schedule: linear, points: {0: 1.0, 10000: 0.2}, by: samples}``: piecewise-linear
between the points (``schedule: step``: each point's weight holds until the next one), the
first point's weight before it and the last one's after it. ``by`` is what the points count:

- ``samples`` (the default; it needs nothing but the mix): samples drawn by the mix over all
  ranks and DataLoader workers, ``slots * n`` after ``n`` draws of each slot, plus, from the
  second epoch on, the epochs before (``with_epoch(nbatches=N)`` gives their length: ``N * B *
  world_size``; an epoch without a length starts the count again);
- ``step``: global steps, batches over all ranks: the samples above over the batch size
  (``.batched(B)`` in the pipeline, or ``with_epoch(..., batch_size=B)``).

Nothing of a schedule is stored: a slot's weights are derived from its draws (``mix.n`` of the
resumable state), its epoch and the job's shape, so a resume (also with another schedule, or
in another shape) continues on the schedule where the position says. The mix evaluates the
weights once per block of draws (:data:`~wds_cloud.spec.build._BLOCK`), at the block's
middle: the schedule costs nothing per sample.

Layer 2: plain values in, plain values out; :func:`read_schedule` validates strictly.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["KINDS", "UNITS", "Clock", "WeightSchedule", "check_positive", "read_schedule"]

KINDS = ("linear", "step")
UNITS = ("samples", "step")
_KEYS = ("schedule", "points", "by")


@dataclass(frozen=True)
class WeightSchedule:
    """A weight over the schedule's position (see the module docstring)."""

    kind: str
    points: tuple[tuple[int, float], ...]
    by: str = "samples"

    def at(self, position: float) -> float:
        """The weight at ``position`` (samples or steps, as :attr:`by` says)."""
        xs = [x for x, _ in self.points]
        i = bisect.bisect_right(xs, position)
        if i == 0:
            return self.points[0][1]
        if i == len(xs) or self.kind == "step":
            return self.points[i - 1][1]
        (x0, y0), (x1, y1) = self.points[i - 1], self.points[i]
        return y0 + (y1 - y0) * (position - x0) / (x1 - x0)

    def left(self, position: float) -> float:
        """The weight just before ``position`` (a step schedule jumps at its points)."""
        if self.kind == "linear":
            return self.at(position)
        xs = [x for x, _ in self.points]
        i = bisect.bisect_left(xs, position)
        return self.points[max(i - 1, 0)][1]

    def scaled(self, factor: float) -> WeightSchedule:
        """The schedule with every weight times ``factor``."""
        return WeightSchedule(self.kind, tuple((x, y * factor) for x, y in self.points),
                              self.by)

    def describe(self) -> dict[str, Any]:
        """The schedule in canonical keys (``spec check``, the state's record of it)."""
        return {"schedule": self.kind, "by": self.by, "points": dict(self.points)}

    def __str__(self) -> str:
        points = ", ".join(f"{x}: {y:g}" for x, y in self.points)
        return f"{self.kind} by {self.by} {{{points}}}"


def read_schedule(value: Mapping[str, Any], fail: Callable[[str, str], Exception],
                  path: str) -> WeightSchedule:
    """The schedule a ``weight:`` mapping gives; ``fail(path, what)`` makes the error (it names
    the file and the key as written, e.g. ``datasets[1].weight.points``)."""
    for key in value:
        if key not in _KEYS:
            raise fail(f"{path}.{key}", f"unknown key {key!r} of a weight schedule (known: "
                       f"{', '.join(_KEYS)}; e.g. {{schedule: linear, points: {{0: 1.0, "
                       "10000: 0.2}})")
    kind = value.get("schedule")
    if kind not in KINDS:
        raise fail(f"{path}.schedule", f"expected one of {', '.join(KINDS)}, got {kind!r}")
    by = value.get("by", "samples")
    if by not in UNITS:
        raise fail(f"{path}.by", f"expected samples or step, got {by!r}")
    raw = value.get("points")
    where = f"{path}.points"
    if isinstance(raw, Mapping):
        items: Sequence[Any] = list(raw.items())
    elif isinstance(raw, list) and all(isinstance(p, list) and len(p) == 2 for p in raw):
        items = [tuple(p) for p in raw]
    else:
        raise fail(where, f"expected a mapping of position to weight ({{0: 1.0, 10000: 0.2}}) "
                   f"or a list of [position, weight] pairs, got {raw!r}")
    if not items:
        raise fail(where, "no points: give at least one, e.g. {0: 1.0}")
    points: list[tuple[int, float]] = []
    for x, y in items:
        at = f"{where}.{x}"
        if isinstance(x, str) and x.strip().isdigit():
            x = int(x)
        if isinstance(x, bool) or not isinstance(x, int) or x < 0:
            raise fail(at, f"a position is an integer >= 0 ({by}), got {x!r}")
        if isinstance(y, bool) or not isinstance(y, (int, float)) or not y >= 0 \
                or y == float("inf"):
            raise fail(at, f"expected a weight >= 0, got {y!r}")
        if points and x <= points[-1][0]:
            raise fail(at, f"positions must increase: {x} comes after {points[-1][0]}")
        points.append((x, float(y)))
    return WeightSchedule(str(kind), tuple(points), str(by))


def check_positive(weights: Sequence[tuple[float, WeightSchedule | None]]) -> float | None:
    """A position where every weight is zero, if there is one (else ``None``); ``weights``:
    per source ``(factor, schedule)``, the weight being ``factor`` or ``factor * schedule``.
    Between the points the total is linear (or constant), so its values at every point, and
    just before every point, decide."""
    xs = sorted({x for _, s in weights if s is not None for x, _ in s.points} | {0})
    for x in xs:
        if _total(weights, x, left=False) <= 0 or _total(weights, x, left=True) <= 0:
            return x
    return None


def _total(weights: Sequence[tuple[float, WeightSchedule | None]], x: float, *,
           left: bool) -> float:
    return sum(f * (1.0 if s is None else s.left(x) if left else s.at(x)) for f, s in weights)


@dataclass(frozen=True)
class Clock:
    """Where a slot's draws stand on a schedule: ``slots`` draw at once; ``epoch_samples``,
    samples per epoch over all ranks (``None``: the epoch has no length, each starts at 0);
    ``batch_size`` turns samples into steps (``None``: unknown)."""

    slots: int = 1
    epoch_samples: int | None = None
    batch_size: int | None = None

    def samples(self, epoch: int, drawn: float) -> float:
        """Samples over all slots when this slot has made ``drawn`` draws of ``epoch``."""
        before = epoch * self.epoch_samples if self.epoch_samples else 0
        return before + drawn * self.slots

    def position(self, by: str, epoch: int, drawn: float) -> float:
        """The position in ``by`` (``samples`` or ``step``)."""
        samples = self.samples(epoch, drawn)
        if by == "samples":
            return samples
        if not self.batch_size:
            from ..errors import ConfigError

            raise ConfigError("a weight schedule 'by: step' needs the batch size: batch in the "
                              "pipeline (.batched(B)) or give with_epoch(..., batch_size=B); "
                              "or count the schedule in samples (by: samples)")
        return samples / self.batch_size
