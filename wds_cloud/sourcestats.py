"""The shares a job really saw: per spec source, what a :class:`~wds_cloud.pytorch.WebLoader`'s
workers counted (samples the mix gave, shards opened, requests, bytes read, cache hits,
retries, resumes, failures), summed over the workers and, when ``torch.distributed`` is
initialised, over the ranks; each source's observed share beside the configured one.

Counting costs nothing per sample: the mix tells its per-source counts once per block of 256
draws (and when it stops), the transfers are counted where :func:`~wds_cloud.stores.io_stats`
counts them, attributed to the source whose shard they read
(:func:`~wds_cloud.stores.iostats.reading_for`). Each worker adds to its own slots of the
loader's shared memory (:func:`~wds_cloud.stores.iostats.report_io_to`).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from .settings import human_size

__all__ = ["configured_shares", "gather", "loader_stats", "log_stats", "own_counts", "stats_line",
           "with_shares"]

log = logging.getLogger("wds_cloud.stats")

#: a source this many points off its configured share, over enough samples, is logged at
#: WARNING by the periodic log
OFF = 0.05
ENOUGH = 10_000


def _all_ranks(values: list[int]) -> tuple[list[int], int]:
    """``values`` summed over the ranks of the default process group (a collective: every
    rank must call it), or as they are when none is initialised; and the number of ranks."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not (dist.is_available() and dist.is_initialized()):
        return values, 1
    import torch

    tensor = torch.tensor(values, dtype=torch.int64)
    if dist.get_backend() == "nccl":
        tensor = tensor.cuda()
    dist.all_reduce(tensor)
    return [int(v) for v in tensor.tolist()], dist.get_world_size()


def gather(counters: Sequence[int], workers: int, names: Sequence[str], *,
           all_ranks: bool) -> tuple[dict[str, int], dict[str, dict[str, int]], int]:
    """``(totals, per source, ranks)`` from the loader's shared ``counters``: ``workers``
    blocks of :data:`IO_FIELDS` then each source's :data:`SOURCE_FIELDS`."""
    from .stores.iostats import IO_FIELDS, SOURCE_FIELDS

    width = len(IO_FIELDS) + len(names) * len(SOURCE_FIELDS)
    summed = [sum(counters[w * width + k] for w in range(workers)) for k in range(width)]
    ranks = 1
    if all_ranks:
        summed, ranks = _all_ranks(summed)
    totals = dict(zip(IO_FIELDS, summed, strict=False))
    per: dict[str, dict[str, int]] = {}
    at = len(IO_FIELDS)
    for name in names:
        per[name] = dict(zip(SOURCE_FIELDS, summed[at:at + len(SOURCE_FIELDS)], strict=True))
        at += len(SOURCE_FIELDS)
    return totals, per, ranks


def own_counts(names: Sequence[str]) -> list[int]:
    """This process's counters laid out as one worker's block of :func:`gather`."""
    from .stores.iostats import IO_FIELDS, SOURCE_FIELDS, io_stats, source_stats

    mine, io = source_stats(), io_stats()
    return [*(int(io[field]) for field in IO_FIELDS),
            *(mine.get(name, {}).get(field, 0) for name in names for field in SOURCE_FIELDS)]


def configured_shares(spec: Any, *, epoch: int, seed: int, samples: int,
                      batch_size: int | None) -> dict[str, float]:
    """The shares the spec asks for in ``epoch``; with weight schedules, their mean over the
    first ``samples`` samples (in steps of ``batch_size`` for a schedule ``by: step``)."""
    by = spec.schedule_by
    if by is None or samples <= 0:
        return dict(spec.probabilities(epoch, seed))
    parts = 64
    out = dict.fromkeys((s.name for s in spec.sources), 0.0)
    for k in range(parts):
        at = samples * (k + 0.5) / parts
        if by == "step":
            at /= batch_size or 1
        for name, share in spec.probabilities(epoch, seed, at=at).items():
            out[name] += share / parts
    return out


def with_shares(per: Mapping[str, dict[str, Any]],
                configured: Mapping[str, float]) -> dict[str, dict[str, Any]]:
    """``per`` with each source's observed ``share`` of the samples and its ``configured``
    one."""
    total = sum(int(counts.get("samples", 0)) for counts in per.values())
    return {name: {**counts, "share": counts["samples"] / total if total else 0.0,
                   "configured": configured.get(name, 0.0)}
            for name, counts in per.items()}


def stats_line(stats: Mapping[str, Any]) -> str:
    """One log line: per source its share (configured), samples, shards, GETs, bytes, cache
    hits and retries."""
    parts = []
    for name, s in stats["sources"].items():
        parts.append(f"{name} {100 * s['share']:.1f}% (configured {100 * s['configured']:.1f}%"
                     f"), {s['samples']:,} samples, {s['shards']:,} shards, "
                     f"{s['requests']:,} GETs, {human_size(s['bytes_read'])}, "
                     f"{s['cache_hits']:,} cache hits, {s['retries']:,} retries")
    ranks = f" over {stats['ranks']} ranks" if stats["ranks"] > 1 else ""
    return f"sources after {stats['samples']:,} samples{ranks}: " + "; ".join(parts)


def log_stats(stats: Mapping[str, Any]) -> None:
    """Log ``stats`` at INFO, and at WARNING each source far off its configured share."""
    log.info("%s", stats_line(stats))
    if stats["samples"] < ENOUGH:
        return
    for name, s in stats["sources"].items():
        if abs(s["share"] - s["configured"]) > OFF:
            log.warning("source %r: %.1f%% of the samples so far, configured %.1f%%: is it "
                        "failing or skipped (see its retries and failures)?", name,
                        100 * s["share"], 100 * s["configured"])


def loader_stats(loader: Any, counters: Sequence[int] | None, names: Sequence[str], *,
                 all_ranks: bool) -> dict[str, Any]:
    """``WebLoader.stats()``: ``counters`` its workers' shared memory (None without workers:
    this process's own counts), ``names`` the spec's sources."""
    dataloader = loader.dataloader
    workers = dataloader.num_workers
    if counters is None:
        counters, workers = own_counts(names), 1
    totals, per, ranks = gather(counters, workers, names, all_ranks=all_ranks)
    samples = sum(counts["samples"] for counts in per.values())
    dataset = dataloader.dataset
    spec = getattr(dataset, "spec", None)
    configured: dict[str, float] = {}
    if spec is not None and spec.mode == "mix":
        configured = configured_shares(
            spec, epoch=max(loader._epoched.current, 0),
            seed=getattr(dataset, "seed", None) or 0, samples=samples,
            batch_size=_batch_size(dataloader))
    return {"samples": samples, "ranks": ranks, "io": totals,
            "sources": with_shares(per, configured)}


def _batch_size(dataloader: Any) -> int | None:
    """The batch size of the loader's pipeline (its first ``batched``) or of the loader."""
    from .pipeline.stagecheck import describe_stages

    stages = describe_stages(getattr(dataloader.dataset, "pipeline", []))
    found = [k.split(":")[1] for k in stages.split(",")
             if k.split(":")[0] in ("batched", "listed")]
    if found and found[0].isdigit():
        return int(found[0])
    return dataloader.batch_size if isinstance(dataloader.batch_size, int) else None
