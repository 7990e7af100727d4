"""What a parallel run over shards reports: one :class:`ShardReport` per shard and the
:class:`RunReport` of the whole run, raised inside a
:class:`~wds_cloud.errors.ShardTaskError` when some shards failed."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import ShardTaskError
from ..settings import human_size
from ..urls import redact
from .executors import TaskOutcome

__all__ = ["RunReport", "ShardDone", "ShardReport"]

#: failed shards named in a ShardTaskError's message (the rest are counted)
_NAMED = 10


@dataclass(frozen=True)
class ShardDone:
    """What a task returns for the shard it wrote: ``size`` is the tar file's bytes (before
    compression, for a compressed shard)."""

    output: str
    samples: int
    size: int
    samples_in: int | None = None


@dataclass
class ShardReport:
    """One shard of a run: where it was read from (``input``, None for ``create_shards``)
    and written to, ``samples`` written (and ``samples_in`` read), ``size`` in bytes of tar,
    ``attempts`` made and the ``errors`` of the failed ones (retried, or final)."""

    output: str
    input: str | None = None
    samples: int = 0
    samples_in: int | None = None
    size: int = 0
    attempts: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        """The shard as reports name it: its input URL, else its output."""
        return self.input if self.input is not None else self.output

    @property
    def ok(self) -> bool:
        return len(self.errors) < self.attempts

    @property
    def error(self) -> str | None:
        """The last error when the shard failed for good."""
        return None if self.ok else (self.errors[-1] if self.errors else "not run")

    @classmethod
    def of(cls, output: str, input: str | None, outcome: TaskOutcome) -> ShardReport:
        report = cls(output, input, attempts=outcome.attempts, errors=list(outcome.errors))
        done = outcome.value
        if isinstance(done, ShardDone) and not outcome.failed:
            report.samples, report.size, report.samples_in = (done.samples, done.size,
                                                              done.samples_in)
        return report

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"output": redact(self.output)}
        if self.input is not None:
            doc["input"] = redact(self.input)
            doc["samples_in"] = self.samples_in
        doc.update(samples=self.samples, size=self.size, ok=self.ok, attempts=self.attempts,
                   errors=list(self.errors))
        return doc


@dataclass
class RunReport:
    """A run over shards: the :class:`ShardReport` of each shard in order, the time it took,
    and (``create_shards``) the files left out of every sample, by reason."""

    shards: list[ShardReport] = field(default_factory=list)
    seconds: float = 0.0
    skipped: dict[str, list[str]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(s.ok for s in self.shards)

    @property
    def written(self) -> list[ShardReport]:
        return [s for s in self.shards if s.ok]

    @property
    def failed(self) -> dict[str, str]:
        """Each shard that failed after its retries -> its last error."""
        return {s.name: s.error or "" for s in self.shards if not s.ok}

    @property
    def retried(self) -> dict[str, list[str]]:
        """Each shard written after failed attempts -> their errors."""
        return {s.name: list(s.errors) for s in self.shards if s.ok and s.errors}

    @property
    def samples(self) -> int:
        return sum(s.samples for s in self.written)

    @property
    def size(self) -> int:
        return sum(s.size for s in self.written)

    def summary(self) -> str:
        """``6 samples in 3 shards (30.0 KiB) in 0.12 s: out/p-000000.tar .. out/p-000002.tar``
        (``in 2 of 3 shards`` when some failed)."""
        done, total = len(self.written), len(self.shards)
        shards = _count(done, "shard") if done == total else f"{done} of {_count(total, 'shard')}"
        names = [redact(s.output) for s in self.written]
        where = f": {names[0]}" + (f" .. {names[-1]}" if len(names) > 1 else "") if names else ""
        return (f"{_count(self.samples, 'sample')} in {shards} ({human_size(self.size)}) in "
                f"{self.seconds:.2f} s{where}")

    def __str__(self) -> str:
        return self.summary()

    def raise_for_failures(self, what: str = "shards") -> RunReport:
        """Raise a :class:`ShardTaskError` naming every failed shard, if any; else ``self``."""
        failed = self.failed
        if not failed:
            return self
        attempts = max(s.attempts for s in self.shards if not s.ok)
        named = [f"{redact(name)} ({error})" for name, error in list(failed.items())[:_NAMED]]
        more = f"; and {len(failed) - _NAMED} more" if len(failed) > _NAMED else ""
        raise ShardTaskError(
            f"{len(failed)} of {len(self.shards)} {what} failed after {attempts} "
            f"attempt{'s' if attempts != 1 else ''}, the others were written: "
            f"{'; '.join(named)}{more}", failed=failed, report=self)

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "samples": self.samples, "size": self.size,
                "seconds": round(self.seconds, 3), "shards": [s.to_json() for s in self.shards],
                "failed": {redact(k): v for k, v in self.failed.items()},
                "retried": {redact(k): v for k, v in self.retried.items()},
                "skipped": {k: list(v) for k, v in self.skipped.items()}}


def _count(n: int, word: str) -> str:
    return f"{n:,} {word}{'' if n == 1 else 's'}"


def shard_callback(
    on_shard: Callable[[ShardReport], None] | None,
    shards: Mapping[str, tuple[str, str | None]],
) -> Callable[[TaskOutcome], None] | None:
    """``run_tasks``' ``on_outcome``, calling ``on_shard`` with the shard's report (``shards``:
    task name -> (output, input))."""
    if on_shard is None:
        return None
    return lambda outcome: on_shard(ShardReport.of(*shards[outcome.name], outcome))
