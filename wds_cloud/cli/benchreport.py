"""What ``wds-cloud bench`` reports: its text lines, its ``--json`` document and its
``--plot`` PNG (throughput over time and the shards' open latencies, two panels), drawn with
matplotlib (the ``plot`` extra) on the Agg canvas: no display, no pyplot state."""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from itertools import pairwise
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError, MissingDependencyError
from ..settings import human_size
from ..urls import redact
from .common import plural

if TYPE_CHECKING:
    from .bench import Baseline, Run

__all__ = ["DPI", "SIZE", "document", "lines", "percentiles", "plot", "require_matplotlib",
           "title"]


def percentiles(values: Sequence[float]) -> dict[str, float] | None:
    """``{"p50", "p90", "p99", "max"}`` of ``values`` (nearest rank), None if empty."""
    if not values:
        return None
    ordered = sorted(values)

    def rank(p: float) -> float:
        return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]

    return {"p50": rank(50), "p90": rank(90), "p99": rank(99), "max": ordered[-1]}


# -- text and JSON -------------------------------------------------------------------------

def _rate(n: float, seconds: float) -> float:
    return n / max(seconds, 1e-9)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.1f} ms" if seconds < 10 else f"{seconds:,.1f} s"


def _seconds(seconds: float) -> str:
    return f"{seconds:.3f} s" if seconds < 1 else f"{seconds:,.2f} s"


def _stop(run: Run, args: argparse.Namespace) -> str:
    if run.stopped == "limit":
        return f"; stopped at --limit {args.limit:,}"
    if run.stopped == "seconds":
        return f"; stopped after {args.seconds:g} s"
    return "; interrupted" if run.stopped == "interrupted" else ""


def _ratio(run: Run, baseline: Baseline) -> float | None:
    if baseline.skipped or not baseline.nbytes:
        return None
    return baseline.seconds / max(run.seconds, 1e-9)


def _how(args: argparse.Namespace) -> str:
    workers = plural(args.workers, "worker") if args.workers else "in-process"
    return f"{workers}{', decoded' if args.decode else ''}"


def lines(run: Run, baseline: Baseline, args: argparse.Namespace) -> list[str]:
    """The text report: ``throughput:``, ``first sample after``, ``shard open latency:``,
    ``baseline:`` and ``ratio:`` lines (and ``plot:``)."""
    out = [
        f"throughput: {_rate(run.samples, run.seconds):,.0f} samples/s, "
        f"{_rate(run.payload, run.seconds) / 1e6:,.1f} MB/s ({plural(run.samples, 'sample')}, "
        f"{human_size(run.payload)} in {_seconds(run.seconds)}; {_how(args)}"
        f"{_stop(run, args)})",
        f"first sample after {_seconds(run.first or 0.0)}",
    ]
    p = percentiles(run.waits)
    if p:
        out.append(f"shard open latency: p50 {_ms(p['p50'])}, p90 {_ms(p['p90'])}, "
                     f"p99 {_ms(p['p99'])}, max {_ms(p['max'])} "
                     f"({plural(len(run.waits), 'shard')}; wait for each shard's first sample)")
    ratio = _ratio(run, baseline)
    if baseline.skipped:
        out.append(f"baseline: skipped ({baseline.skipped})")
    elif ratio is not None:
        rate = _rate(baseline.nbytes, baseline.seconds) / 1e6
        fb = percentiles(baseline.first_bytes) or {"p50": 0.0, "max": 0.0}
        out.append(f"baseline: plain sequential read of the same bytes: "
                     f"{human_size(baseline.nbytes)} in {_seconds(baseline.seconds)}, "
                     f"{rate:,.1f} MB/s (first byte per open: p50 {_ms(fb['p50'])}, "
                     f"max {_ms(fb['max'])})")
        out.append(f"ratio: {ratio:.2f}x of a plain sequential read of the same bytes "
                     f"({rate:,.1f} MB/s; this run read them at "
                     f"{_rate(run.tar_bytes, run.seconds) / 1e6:,.1f} MB/s)")
    if args.plot:
        out.append(f"plot: {args.plot}")
    return out


def document(run: Run, baseline: Baseline, args: argparse.Namespace) -> dict[str, Any]:
    """The ``--json`` report: every number (seconds, bytes, MB/s = 10^6 bytes/s)."""
    base: dict[str, Any] | None = None
    if not baseline.skipped:
        base = {"bytes": baseline.nbytes, "seconds": baseline.seconds,
                "mb_per_s": _rate(baseline.nbytes, baseline.seconds) / 1e6,
                "opens": len(baseline.first_bytes),
                "first_byte": percentiles(baseline.first_bytes),
                "run_mb_per_s": _rate(run.tar_bytes, run.seconds) / 1e6}
    timeline = run.timeline()
    return {
        "inputs": [redact(g) for g in args.inputs],
        "workers": args.workers,
        "decode": args.decode,
        "stopped": run.stopped,
        "limit": args.limit,
        "seconds": args.seconds,
        "throughput": {
            "samples": run.samples, "bytes": run.payload, "tar_bytes": run.tar_bytes,
            "seconds": run.seconds, "samples_per_s": _rate(run.samples, run.seconds),
            "mb_per_s": _rate(run.payload, run.seconds) / 1e6,
        },
        "first_sample_seconds": run.first,
        "shard_open_latency": {"shards": len(run.waits), **(percentiles(run.waits) or {}),
                               "seconds": run.waits},
        "shards": [{"url": redact(url), "tar_bytes": n, "reads": k}
                   for url, (n, k) in run.reads.items()],
        "baseline": base,
        "baseline_skipped": baseline.skipped,
        "ratio": _ratio(run, baseline),
        "timeline": {"bucket_seconds": timeline.bucket, "samples": timeline.samples,
                     "bytes": timeline.nbytes},
        "plot": args.plot,
    }


def title(given: Sequence[str], args: argparse.Namespace) -> str:
    names = ", ".join(redact(g) for g in given)
    return f"wds-cloud bench {names[:80]}{'...' if len(names) > 80 else ''} ({_how(args)})"


# -- the plot -----------------------------------------------------------------------------

#: the figure in inches, and dots per inch: a PNG of 1200x800 pixels
SIZE = (12.0, 8.0)
DPI = 100


def require_matplotlib() -> None:
    """Raise :class:`MissingDependencyError` naming the ``plot`` extra if matplotlib is
    missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        raise MissingDependencyError("wds-cloud bench --plot", "matplotlib", "plot") from exc


def plot(path: str, run: Run, baseline: Baseline, *, title: str) -> None:
    """Write the PNG ``path``: samples/s and MB/s per bucket over time (top), the cumulative
    distribution of the shards' open latencies, with the baseline's first-byte times (bottom)."""
    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=SIZE, dpi=DPI)
    FigureCanvasAgg(fig)
    top, bottom = fig.subplots(2, 1)
    _throughput(top, run)
    _latency(bottom, run, baseline)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=DPI, format="png")
    except OSError as exc:
        raise ConfigError(f"--plot {path}: cannot write it: {exc}") from exc


def _throughput(ax: Any, run: Run) -> None:
    line = run.timeline()
    edges = line.edges
    widths = [max(b - a, 1e-9) for a, b in pairwise(edges)]
    mbs = [n / w / 1e6 for n, w in zip(line.nbytes, widths, strict=True)]
    rates = [n / w for n, w in zip(line.samples, widths, strict=True)]
    ax.stairs(mbs, edges, color="tab:blue", linewidth=1.5, label="MB/s")
    ax.set_xlabel(f"seconds since reading began ({line.bucket:g} s buckets)")
    ax.set_ylabel("MB/s", color="tab:blue")
    ax.set_ylim(bottom=0)
    ax.set_xlim(0, edges[-1])
    twin = ax.twinx()
    twin.stairs(rates, edges, color="tab:orange", linewidth=1.0, label="samples/s")
    twin.set_ylabel("samples/s", color="tab:orange")
    twin.set_ylim(bottom=0)
    if run.first is not None:
        ax.axvline(run.first, color="gray", linestyle="--", linewidth=1)
        ax.annotate(f" first sample {run.first:.2f} s", (run.first, 0.9),
                    xycoords=("data", "axes fraction"), fontsize=8, color="gray")
    ax.set_title("throughput over time", fontsize=10)
    ax.grid(alpha=0.3)


def _cdf(ax: Any, seconds: list[float], label: str, color: str) -> None:
    ordered = sorted(s * 1e3 for s in seconds)
    n = len(ordered)
    ax.step(ordered, [(i + 1) / n for i in range(n)], where="post", color=color,
            label=f"{label} ({n})")


def _latency(ax: Any, run: Run, baseline: Baseline) -> None:
    if not run.waits:
        ax.text(0.5, 0.5, "no shard started", ha="center", va="center",
                transform=ax.transAxes)
        return
    _cdf(ax, run.waits, "wait for a shard's first sample", "tab:blue")
    if baseline.first_bytes:
        _cdf(ax, baseline.first_bytes, "plain read: open to first byte", "tab:green")
    values = [v for v in run.waits + baseline.first_bytes if v > 0]
    if values and max(values) / min(values) > 50:
        ax.set_xscale("log")
    marks = percentiles(run.waits) or {}
    for name, value in marks.items():
        ax.axvline(value * 1e3, color="tab:blue", linestyle=":", linewidth=0.8)
        ax.annotate(f" {name}", (value * 1e3, 0.05), fontsize=8, color="tab:blue")
    ax.set_xlabel("milliseconds")
    ax.set_ylabel("fraction of shards")
    ax.set_ylim(0, 1.02)
    ax.set_title("shard open latency (cumulative)", fontsize=10)
    ax.legend(loc="upper left", fontsize=8)
    ax.grid(alpha=0.3)
