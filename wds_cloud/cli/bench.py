"""``wds-cloud bench URL|SPEC``: read shards as a training job does and measure it: samples/s,
MB/s, the time to the first sample, each shard's open latency, and a plain sequential read of
the same bytes in the same run to compare with; ``--plot`` draws it (:mod:`.benchreport`)."""

from __future__ import annotations

import argparse
import math
import sys
import time
from array import array
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError
from . import benchreport as report
from .common import (
    INTERRUPTED,
    OK,
    PROBLEMS,
    Input,
    Inputs,
    Progress,
    add_input_options,
    add_json_option,
    command_parser,
    count_arg,
    emit_json,
    storage_options,
)

__all__ = ["Baseline", "Run", "ShardTimer", "Timeline", "add_parser", "cmd_bench"]

#: seconds per slot in which samples and bytes are counted as they come
RESOLUTION = 0.05
#: bucket sizes of the timeline shown (``--json``, ``--plot``): the smallest giving at most
#: :data:`MAX_BUCKETS` buckets
BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0, 600.0, 3600.0)
MAX_BUCKETS = 120
#: how long a spec (an endless mix) is read when neither --limit nor --seconds is given
SPEC_SECONDS = 10.0
_FIRST_READ = 64 << 10  # the baseline's first read of a shard: small, to time its first byte
_CHUNK = 8 << 20  # the baseline's reads after that

_EPILOG = """\
what is measured:
  throughput      samples and their bytes (the members' payload, before decoding) delivered
                  to this process, from the first sample to the last
  first sample    seconds from the start of reading to the first sample (worker start-up,
                  the first shard's open, its first sample)
  shard open      per shard, how long reading waited for its first sample after asking for
  latency         it: the open (or the wait for the read-ahead that opened it earlier) and
                  the first sample's bytes; measured where the shard is read (in the worker
                  with --workers), so it is a stall the reader saw
  baseline        after the run, the same shards' bytes (as many as the run read of each)
                  read with plain sequential reads of 8 MiB through the same opener (cache,
                  rewrite), one shard after the other, no tar parsing; its first-byte time per
                  shard is the store's open latency. It runs second, so it may read from
                  caches the run warmed (OS page cache, shard cache).
  ratio           the baseline's seconds over the run's: 1.00x is as fast as a plain read

examples:
  wds-cloud bench 'shards/train-{000000..000009}.tar'
  wds-cloud bench 's3://bucket/train-*.tar' -o endpoint_url=http://127.0.0.1:9000 --workers 4
  wds-cloud bench config/train.yaml --seconds 30 --decode --plot bench.png
  wds-cloud bench shards/train-000000.tar --json | jq .throughput

"""


def add_parser(sub: Any) -> None:
    from .common import EXIT_CODES

    p = command_parser(sub, "bench", help="read shards as a training job does and measure "
                       "throughput, time to first sample and shard open latency",
                       epilog=_EPILOG + EXIT_CODES)
    add_input_options(p, what="shards to read (one spec, or URLs)")
    p.add_argument("--workers", type=count_arg(0), default=0, metavar="N",
                   help="DataLoader worker processes (wds.WebLoader(dataset.batched(64), "
                   "batch_size=None, num_workers=N), unbatched here); 0 reads in this process, "
                   "without torch")
    p.add_argument("--decode", action="store_true",
                   help="decode samples with the default decoder (as .decode())")
    p.add_argument("--limit", type=count_arg(1), default=None, metavar="N",
                   help="stop after N samples")
    p.add_argument("--seconds", type=float, default=None, metavar="S",
                   help="stop after S seconds of reading (a spec, an endless mix, stops after "
                   f"{SPEC_SECONDS:g} s when neither this nor --limit is given)")
    p.add_argument("--no-baseline", action="store_true",
                   help="skip the plain sequential read of the same bytes")
    p.add_argument("--plot", metavar="FILE.png", default=None,
                   help="draw throughput over time and the shard open latencies to a PNG "
                   "(1200x800 pixels; needs pip install 'wds-cloud[plot]')")
    add_json_option(p)
    p.set_defaults(func=cmd_bench)


# -- measuring where the shards are read ----------------------------------------------------

def _tar_size(sample: Mapping[str, Any]) -> tuple[int, int]:
    """Payload bytes of a raw sample, and the bytes its members take in a tar (header and
    data padded to 512-byte blocks)."""
    payload = tar = 0
    for key, value in sample.items():
        if not key.startswith("__") and isinstance(value, (bytes, bytearray, memoryview)):
            n = len(value)
            payload += n
            tar += 512 + -(-n // 512) * 512
    return payload, tar


class ShardTimer:
    """A pipeline stage right after the reader (it runs in the process that reads, a
    DataLoader worker too): it times each ``next()`` on its source and adds ``__bench__`` =
    ``(payload bytes, tar bytes, wait)`` to every sample, where ``wait`` is the seconds the
    reader took to give the first sample of a new shard (-1 for the other samples). A spec's
    samples are followed per source (``__source__``), since the mix interleaves them."""

    def __call__(self, src: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        last: dict[Any, Any] = {}
        it = iter(src)
        while True:
            start = time.perf_counter()
            try:
                sample = next(it)
            except StopIteration:
                return
            waited = time.perf_counter() - start
            stream, url = sample.get("__source__"), sample.get("__url__")
            new = last.get(stream, self) != url
            last[stream] = url
            payload, tar = _tar_size(sample)
            sample["__bench__"] = (payload, tar, waited if new else -1.0)
            yield sample


@dataclass
class Run:
    """What the run measured (seconds, bytes); ``reads``: per URL in the order first read,
    ``[tar bytes read, times a first sample was read]``."""

    samples: int = 0
    payload: int = 0
    tar_bytes: int = 0
    first: float | None = None
    seconds: float = 0.0
    stopped: str = "end"
    waits: list[float] = field(default_factory=list)
    reads: dict[str, list[int]] = field(default_factory=dict)
    #: samples and payload bytes received per :data:`RESOLUTION` seconds since reading began
    counts: array[int] = field(default_factory=lambda: array("q"))
    nbytes: array[int] = field(default_factory=lambda: array("q"))

    def add(self, sample: Mapping[str, Any], since_start: float) -> int:
        """Count ``sample`` received ``since_start`` seconds after reading began; its payload."""
        payload, tar, wait = sample["__bench__"]
        url = str(sample.get("__url__"))
        self.samples += 1
        self.payload += payload
        self.tar_bytes += tar
        entry = self.reads.setdefault(url, [0, 0])
        entry[0] += tar
        if wait >= 0:
            self.waits.append(float(wait))
            entry[1] += 1
        slot = int(since_start / RESOLUTION)
        if slot >= len(self.counts):
            grow = slot + 1 - len(self.counts)
            self.counts.extend([0] * grow)
            self.nbytes.extend([0] * grow)
        self.counts[slot] += 1
        self.nbytes[slot] += payload
        return int(payload)

    def timeline(self) -> Timeline:
        """Samples and bytes per bucket, from the start of reading to the last sample."""
        end = (self.first or 0.0) + self.seconds
        bucket = next((b for b in BUCKETS if end / b <= MAX_BUCKETS), BUCKETS[-1])
        per = max(1, round(bucket / RESOLUTION))
        n = max(1, math.ceil(len(self.counts) / per))
        samples = [sum(self.counts[i * per:(i + 1) * per]) for i in range(n)]
        nbytes = [sum(self.nbytes[i * per:(i + 1) * per]) for i in range(n)]
        edges = [i * bucket for i in range(n)] + [max(end, (n - 1) * bucket + 1e-6)]
        return Timeline(bucket, edges, samples, nbytes)


@dataclass(frozen=True)
class Timeline:
    """Samples and payload bytes received per bucket of ``bucket`` seconds since reading
    began; ``edges`` (one more than buckets) bound them, the last at the last sample."""

    bucket: float
    edges: list[float]
    samples: list[int]
    nbytes: list[int]


@dataclass
class Baseline:
    """The plain sequential read: bytes, seconds from its first byte to its last, and the
    seconds from each open to its first byte."""

    nbytes: int = 0
    seconds: float = 0.0
    first_bytes: list[float] = field(default_factory=list)
    skipped: str | None = None


# -- the command ----------------------------------------------------------------------------

def cmd_bench(args: argparse.Namespace) -> int:
    if args.seconds is not None and not args.seconds > 0:
        raise ConfigError(f"--seconds: expected a number of seconds > 0, got {args.seconds:g}")
    if args.plot:
        report.require_matplotlib()  # before the run, not after it
    inputs = Inputs.from_args(args)
    spec = _spec_of(inputs.given)
    shards = [] if spec else inputs.shards()  # a spec's, listed by the dataset (and baseline)
    seconds = args.seconds
    if spec and seconds is None and args.limit is None:
        seconds = args.seconds = SPEC_SECONDS
        if not args.quiet:
            print(f"wds-cloud bench: a spec is an endless mix: reading for {seconds:g} s "
                  "(set --limit or --seconds)", file=sys.stderr)
    dataset = _dataset(spec, shards, args)
    run = _measure(_loader(dataset, args.workers), args.limit, seconds, args.quiet)
    if not run.samples and run.stopped == "interrupted":  # nothing to report, nothing wrong
        print(f"wds-cloud bench: interrupted before the first sample of "
              f"{', '.join(inputs.given)}", file=sys.stderr)
        return INTERRUPTED
    if not run.samples:
        print(f"wds-cloud bench: error: no samples in {', '.join(inputs.given)}",
              file=sys.stderr)
        return PROBLEMS
    if args.no_baseline or run.stopped == "interrupted":
        baseline = Baseline(skipped="--no-baseline" if args.no_baseline else "interrupted")
    else:
        baseline = _baseline(inputs, shards or inputs.shards(), run)
    if args.plot:
        report.plot(args.plot, run, baseline, title=report.title(inputs.given, args))
    if args.json:
        emit_json(report.document(run, baseline, args))
    else:
        for line in report.lines(run, baseline, args):
            print(line)
    return INTERRUPTED if run.stopped == "interrupted" else OK


def _spec_of(given: Sequence[str]) -> str | None:
    specs = [g for g in given if g.endswith((".yaml", ".yml", ".json"))]
    if specs and len(given) > 1:
        raise ConfigError(f"bench reads one spec, or URLs; got {' '.join(given)}")
    return specs[0] if specs else None


def _dataset(spec: str | None, shards: Sequence[Input], args: argparse.Namespace) -> Any:
    """The dataset a training job would build, with :class:`ShardTimer` after the reader."""
    import wds_cloud as wds

    options = storage_options(args)
    if spec:
        dataset = wds.WebDataset(spec, storage_options=options, allow_pipe=True)
    else:
        dataset = wds.WebDataset([s.url for s in shards], shardshuffle=False,
                                 empty_check=False, storage_options=options)
    dataset = dataset.compose(ShardTimer())
    return dataset.decode() if args.decode else dataset


#: samples a worker hands over at once, as a job's batches (one sample per hand-over costs
#: the DataLoader's inter-process round trip on every sample)
WORKER_BATCH = 64


def _loader(dataset: Any, workers: int) -> Any:
    if not workers:
        return dataset
    import wds_cloud as wds

    batches = dataset.batched(WORKER_BATCH, collation_fn=list)
    return _samples_of(wds.WebLoader(batches, batch_size=None, num_workers=workers))


def _samples_of(batches: Iterable[list[dict[str, Any]]]) -> Iterator[dict[str, Any]]:
    for batch in batches:
        yield from batch


def _measure(source: Iterable[dict[str, Any]], limit: int | None, seconds: float | None,
             quiet: bool) -> Run:
    """Read ``source`` until its end, ``limit`` samples or ``seconds``."""
    run = Run()
    with Progress("bench", total=limit, enabled=not quiet) as progress:
        start = time.perf_counter()
        it = iter(source)
        try:
            for sample in it:
                now = time.perf_counter()
                if run.first is None:
                    run.first = now - start
                progress.update(1, run.add(sample, now - start))
                run.seconds = now - start - run.first
                if limit is not None and run.samples >= limit:
                    run.stopped = "limit"
                    break
                if seconds is not None and now - start >= seconds:
                    run.stopped = "seconds"
                    break
        except KeyboardInterrupt:  # report what was measured so far
            run.stopped = "interrupted"
        finally:
            close = getattr(it, "close", None)
            if close is not None:
                close()
    return run


def _baseline(inputs: Inputs, shards: Sequence[Input], run: Run) -> Baseline:
    """Read the bytes the run read of each shard, one shard after the other."""
    by_url = {s.url: s for s in shards}
    if any(url == "-" for url in run.reads):
        return Baseline(skipped="standard input cannot be read twice")
    base = Baseline()
    start: float | None = None
    for url, (nbytes, opens) in run.reads.items():
        shard = by_url.get(url) or Input(url, None, inputs.options)
        opens = max(opens, 1)
        for _ in range(opens):  # a shard read k times (a spec's passes), k times here
            t0 = time.perf_counter()
            stream = inputs.open(shard)
            try:
                want = -(-nbytes // opens)
                data = stream.read(min(_FIRST_READ, want))
                now = time.perf_counter()
                base.first_bytes.append(now - t0)
                start = now if start is None else start
                got = len(data)
                while data and got < want:
                    data = stream.read(min(_CHUNK, want - got))
                    got += len(data)
            finally:
                stream.close()
            base.nbytes += got
    base.seconds = time.perf_counter() - start if start is not None else 0.0
    return base
