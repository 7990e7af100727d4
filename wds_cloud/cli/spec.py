"""``wds-cloud spec check FILE``: validate a dataset spec and show what an epoch of it reads.

Loads the spec (``${VAR}`` from the environment; ``pipe:`` refused unless ``--allow-pipe``),
then for each source lists its shards (globs through the router, brace lists looked up with one
listing per directory: :func:`wds_cloud.listing.shard_sizes`), reads its smallest shard to count
samples, and prints one row per source (:mod:`.specreport` computes the numbers), warnings, and
with ``--simulate`` the shares the mixing RNG draws. ``--no-list`` skips all I/O.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError, UnsafeURLError, WdsCloudError
from ..settings import Settings
from ..urls import redact
from .common import (
    add_input_options,
    command_parser,
    count_arg,
    plural,
    source_options,
    storage_options,
)
from .specreport import (
    Found,
    Shape,
    rows_of,
    schedule_lines,
    schedule_positions,
    schedule_rows,
    simulate,
    simulation_lines,
    table_lines,
    warnings_of,
)

if TYPE_CHECKING:
    from ..listing import Listings
    from ..spec import DatasetSpec, SourceSpec

__all__ = ["add_parser", "cmd_spec"]

OK, INVALID, UNREACHABLE = 0, 1, 2
_SHOWN = 3  # missing URLs named in a message

_CHECK = """\
Validate a dataset spec (YAML or JSON) and show, per source: shards found, bytes, weight,
scale, share (min / expected / max over the scale ranges, and realized in epoch 0), samples
(estimated from the source's smallest shard, scaled by bytes), and per epoch the expected
samples, passes over the source, GET requests and bytes read; then warnings. A spec with
resample/choose (counted) shows shards per epoch instead of shares.

Per-epoch numbers need --batch-size and --epoch-batches (per rank); --world-size and --workers
give the slots (ranks x DataLoader workers). --simulate S runs only the mixing RNG: S draws in
every slot in epoch 0, no I/O, observed next to realized shares.

Shards are listed where they will be read from (rewrite rules, AIStore), with the spec's
storage_options: globs through the router, brace lists with one listing per directory (one
metadata request per shard for up to 3; http(s): a request for each one's first byte);
pipe: sizes are not looked up. GET requests count one per shard read, and in a mix one
per stream for the shard opened ahead when the epoch stops (WDS_READAHEAD=0: none); bytes
read count whole shards (an upper bound). If a source cannot be listed or read, the table
(with its shares) is still printed, then the errors, and the exit status is 2. --no-list
skips all I/O: the shares, and counts of brace patterns, from the spec alone (e.g. for
shards not reachable from here).

exit status: 0 ok; 1 invalid spec (the message names the file and key); 2 shards unreachable,
missing or unmatched (the message names the source and URL)."""



_positive = count_arg(1)
_count = count_arg(0)


def add_parser(sub: Any) -> None:
    """Register ``spec`` and ``spec check`` on the ``wds-cloud`` subparsers ``sub``."""
    parser = command_parser(sub, "spec", help="check a dataset spec (YAML/JSON)",
                            description="Work with dataset specs (YAML/JSON).", epilog=None)
    actions = parser.add_subparsers(dest="spec_command", required=True, metavar="COMMAND")
    p = command_parser(actions, "check", help="validate a spec; per source: shards, bytes, "
                       "shares, per-epoch reads; warnings", description=_CHECK, epilog=None)
    p.add_argument("file", metavar="FILE", help="the spec: .yaml, .yml or .json, or "
                   "FILE#key.path for a section of a larger config (train.yaml#train_loader."
                   "dataset)")
    p.add_argument("--split", metavar="NAME",
                   help="the split of an Energon metadataset (default train)")
    p.add_argument("--strict", action="store_true",
                   help="refuse keys of the spec read but not used here (e.g. Energon's "
                   "sample_type in a blend entry; what energon prepare wrote into a dataset's "
                   ".nv-meta/dataset.yaml is only noted)")
    p.add_argument("--world-size", type=_positive, default=1, metavar="R",
                   help="ranks")
    p.add_argument("--workers", type=_count, default=1, metavar="W",
                   help="DataLoader workers per rank (0 counts as 1 slot)")
    p.add_argument("--batch-size", type=_positive, metavar="B", help="samples per batch")
    p.add_argument("--epoch-batches", type=_positive, metavar="N",
                   help="batches per rank per epoch (with_epoch(nbatches=N))")
    p.add_argument("--json", action="store_true",
                   help="one JSON object: spec, sources, warnings, simulation, errors")
    p.add_argument("--simulate", type=_positive, metavar="S",
                   help="draw S samples' sources per slot with the mixing RNG (no I/O)")
    p.add_argument("--plot", metavar="FILE.png", default=None,
                   help="draw the shares of a spec with weight schedules over training "
                   "(needs pip install 'wds-cloud[plot]')")
    p.add_argument("--seed", type=int, metavar="N",
                   help="seed (default: WDS_SEED, else the spec's seed, else 0)")
    p.add_argument("--allow-pipe", action="store_true", help="accept pipe: URLs in the spec")
    p.add_argument("--no-list", action="store_true",
                   help="no I/O: do not list or read shards (shares from the spec alone)")
    add_input_options(p, inputs=False)
    parser.set_defaults(func=cmd_spec)


def cmd_spec(args: argparse.Namespace) -> int:
    """Run ``wds-cloud spec check``; the exit status."""
    from ..spec import load_spec
    from ..specdataset import spec_opener

    settings = Settings.from_env()
    try:
        spec = load_spec(args.file, environ=settings.environ, allow_pipe=args.allow_pipe,
                         split=args.split, strict=args.strict,
                         open_stream=spec_opener(settings, storage_options(args)))
    except (ConfigError, UnsafeURLError) as exc:
        if isinstance(exc.__cause__, OSError):  # the spec file (or one it names) unreadable
            print(f"wds-cloud spec check: {exc}", file=sys.stderr)
            return UNREACHABLE
        return _invalid(str(exc), hint=isinstance(exc, UnsafeURLError))
    except OSError as exc:  # the file itself
        print(f"wds-cloud spec check: cannot read {args.file}: {exc.strerror or exc}",
              file=sys.stderr)
        return UNREACHABLE
    try:
        cli_options = storage_options(args)
    except ConfigError as exc:
        return _invalid(str(exc))
    seed, seed_from = _seed(args.seed, settings, spec)
    shape = Shape(args.world_size, args.workers, args.batch_size, args.epoch_batches,
                  ahead=min(settings.readahead, 1))
    found = [Found() for _ in spec.sources]
    invalid: list[str] = []
    errors: list[str] = []
    if not args.no_list:
        found, invalid, errors = _probe_all(spec, settings, cli_options,
                                             quiet=args.quiet or args.json)
    rows = rows_of(spec, found, shape, seed)
    warnings = warnings_of(spec, rows, shape) + _extension_warnings(spec, found)
    unused = list(dict.fromkeys([*spec.unused, *(note for got in found for note in got.notes)]))
    if args.strict:  # the spec's own keys; a prepared dataset's .nv-meta stays a note
        invalid += [f"invalid spec: {spec.origin}: {key}: not used here: {why} (--strict)"
                    for key, why in spec.unused]
    sim = None
    if args.simulate:
        if spec.mode != "mix":
            warnings.append(f"--simulate: this spec reads per-epoch {spec.mode} and draws "
                            "no sources by weight: nothing to simulate")
        else:
            sim = simulate(spec, seed=seed, slots=shape.slots, n=args.simulate,
                           batch_size=shape.batch_size)
    sched = (schedule_rows(spec, seed, schedule_positions(spec))
             if spec.schedule_by is not None else None)
    if args.plot:
        if sched is None:
            return _invalid(f"--plot {args.plot}: {spec.origin} has no weight schedule; "
                            "its shares do not change over training")
        try:
            _plot(args.plot, spec, seed)
        except (ConfigError, ImportError) as exc:
            print(f"wds-cloud spec check: {exc}", file=sys.stderr)
            return INVALID
    if args.json:
        print(json.dumps({
            "spec": spec.describe(), "seed": seed, "seed_from": seed_from,
            "shape": {"world_size": shape.world_size, "workers": shape.workers,
                      "slots": shape.slots, "batch_size": shape.batch_size,
                      "epoch_batches": shape.epoch_batches, "samples_per_epoch": shape.samples},
            "sources": rows, "warnings": warnings, "simulation": sim, "schedule": sched,
            "errors": invalid + errors,
            "not_used": [{"key": key, "why": why} for key, why in unused],
        }, indent=2, default=str))
    else:
        _print_report(spec, rows, warnings, sim, shape, seed, seed_from, listed=not args.no_list)
        if sched is not None:
            print()
            for line in schedule_lines(sched):
                print(line)
        if args.plot:
            print(f"plot: {args.plot}")
        if unused:
            print()
            for key, why in unused:
                print(f"not used here: {key}: {why}")
    for message in invalid + errors:
        print(f"wds-cloud spec check: {message}", file=sys.stderr)
    return INVALID if invalid else UNREACHABLE if errors else OK


def _plot(path: str, spec: DatasetSpec, seed: int) -> None:
    """Write the PNG ``path``: each source's share (epoch 0) over the weight schedules."""
    from ..errors import MissingDependencyError

    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise MissingDependencyError("wds-cloud spec check --plot", "matplotlib",
                                     "plot") from exc
    last = max(x for s in spec.sources if s.schedule is not None for x, _ in s.schedule.points)
    end = max(last * 1.25, 1)
    xs = [end * k / 400 for k in range(401)]
    shares = [spec.probabilities(0, seed, at=x) for x in xs]
    fig = Figure(figsize=(8.0, 4.5), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    for source in spec.sources:
        ax.plot(xs, [100 * row[source.name] for row in shares], label=source.name)
    unit = {"samples": "samples (over all ranks and workers)",
            "step": "global steps (batches over all ranks)"}[spec.schedule_by or "samples"]
    ax.set_xlabel(unit)
    ax.set_ylabel("share of the samples (%)")
    ax.set_ylim(0, 100)
    ax.set_xlim(0, end)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"{spec.origin}: shares over the weight schedules", fontsize=10)
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=100, format="png")
    except OSError as exc:
        raise ConfigError(f"--plot {path}: cannot write it: {exc}") from exc


def _extension_warnings(spec: DatasetSpec, found: Sequence[Found]) -> list[str]:
    """A source's ``extensions`` that no member of the shard read has (``clss``)."""
    from ..spec.extensions import unmatched_extensions, unmatched_message

    out = []
    for source, got in zip(spec.sources, found, strict=True):
        if source.extensions is None or not got.samples_read or got.shard_read is None:
            continue
        for ext, close in unmatched_extensions(source.extensions, got.extensions):
            where = f"the {plural(got.samples_read, 'sample')} of {redact(got.shard_read)}"
            out.append(f"{source.name}: {spec.origin}: {source.key}.extensions: "
                       f"{unmatched_message(ext, close, got.extensions, where)}")
    return out


def _invalid(message: str, *, hint: bool = False) -> int:
    print(f"wds-cloud spec check: invalid spec: {message}", file=sys.stderr)
    if hint:
        print("wds-cloud spec check: pass --allow-pipe if the spec is trusted", file=sys.stderr)
    return INVALID


def _seed(seed: int | None, settings: Settings, spec: DatasetSpec) -> tuple[int, str]:
    """The seed the job would use (argument > WDS_SEED > spec), and where it came from; 0
    stands in when none is given (the job would then draw one at random)."""
    if seed is not None:
        return seed, "--seed"
    if settings.seed is not None:
        return settings.seed, "WDS_SEED"
    if spec.seed is not None:
        return spec.seed, "the spec"
    return 0, "none given: 0 shown; a job without a seed draws one at random"


class _Steps:
    """A tqdm progress bar on stderr while listing and reading, only on a tty."""

    def __init__(self, total: int, *, enabled: bool) -> None:
        from tqdm import tqdm

        self.bar = tqdm(total=total, unit="step", file=sys.stderr, leave=False,
                        disable=not (enabled and sys.stderr.isatty()))

    def step(self, what: str) -> None:
        self.bar.set_description(what[:40], refresh=False)
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()


def _probe_all(spec: DatasetSpec, settings: Settings, cli_options: dict[str, Any], *,
               quiet: bool) -> tuple[list[Found], list[str], list[str]]:
    """List and sample every source: (found per source, spec errors, I/O errors)."""
    steps = _Steps(2 * len(spec.sources), enabled=not quiet)
    listings: Listings = {}  # sources in one directory share its listing
    found: list[Found] = []
    invalid: list[str] = []
    errors: list[str] = []
    try:
        for source in spec.sources:
            where = (f"source {source.name!r} ({spec.origin}: {source.key}, "
                     f"{redact(source.pattern)!r})")
            got = Found()
            try:
                _probe(spec, source, settings, got, steps, listings, cli_options)
            except ConfigError as exc:
                got.error = str(exc)
                invalid.append(f"invalid spec: {_named(where, spec, exc)}")
            except (WdsCloudError, OSError) as exc:
                got.error = str(exc)
                errors.append(_named(where, spec, exc))
            else:
                if got.urls is not None and not got.urls:
                    got.error = "no shards found"
                    errors.append(f"{where}: {got.error}")
                elif got.missing:
                    shown = ", ".join(repr(u) for u in got.missing[:_SHOWN])
                    more = len(got.missing) - _SHOWN
                    got.error = (f"{len(got.missing)} of {len(source.urls)} shards not "
                                 f"found: {shown}"
                                 + (f" and {more} more" if more > 0 else ""))
                    errors.append(f"{where}: {got.error}")
            found.append(got)
    finally:
        steps.close()
    return found, invalid, errors



def _named(where: str, spec: DatasetSpec, exc: BaseException) -> str:
    """The error's text, led by ``where`` unless it names the spec file already."""
    text = str(exc)
    return text if text.startswith(spec.origin + ":") else f"{where}: {text}"


def _probe(spec: DatasetSpec, source: SourceSpec, settings: Settings, got: Found,
           steps: _Steps, listings: Listings, cli_options: dict[str, Any]) -> None:
    """Fill ``got``: list ``source``'s shards, then count the samples of its smallest."""
    import wds_cloud as wds

    from ..listing import shard_sizes
    from ..router import Router
    from ..spec.extensions import sample_extensions
    from ..specdataset import spec_settings
    from ..specshards import list_source

    options = source_options(cli_options, spec, source)
    settings = spec_settings(spec, settings)
    router = Router(settings, options)
    listed = list_source(spec, source, router)
    urls = listed.urls
    sizes = shard_sizes(urls, router=router, listings=listings)
    got.sizes = sizes
    got.missing = [u for u in urls if u not in sizes]
    got.urls = [u for u in urls if u in sizes]
    got.notes = listed.notes
    steps.step(f"listed {source.name}")
    if got.missing or not got.urls:
        steps.step(f"skipped {source.name}")
        return
    if listed.counts is not None:  # the prepared dataset says them: no shard read
        got.samples_known = sum(listed.counts) - len(listed.excluded)
        steps.step(f"counted {source.name}")
        return
    known = [u for u in got.urls if sizes[u] is not None]
    smallest = min(known, key=lambda u: (sizes[u], u)) if known else got.urls[0]
    pipeline = wds.DataPipeline(
        wds.SimpleShardList([smallest]),
        wds.tarfile_to_samples(storage_options=options, settings=settings))
    got.shard_read = smallest
    got.samples_read = 0
    for sample in pipeline:
        got.samples_read += 1
        got.extensions.update(sample_extensions(sample))
    steps.step(f"read {source.name}")


def _print_report(spec: DatasetSpec, rows: Sequence[dict[str, Any]], warnings: list[str],
                  sim: dict[str, Any] | None, shape: Shape, seed: int, seed_from: str, *,
                  listed: bool) -> None:
    mode = {"shards": "per-epoch shard lists (every shard once, or resample/choose)",
            "mix": "weighted mix (endless)",
            "samples": "samples per source per epoch"}[spec.mode]
    split = f", split {spec.split!r}" if spec.dialect == "energon" else ""
    print(f"spec: {spec.origin}: {plural(len(spec.sources), 'source')}, {mode}")
    print(f"dialect: {spec.dialect}{split}")
    print(f"seed: {seed} ({seed_from})")
    where = (f"{plural(shape.world_size, 'rank')} x {plural(max(shape.workers, 1), 'worker')}"
             f" = {plural(shape.slots, 'slot')}")
    if shape.samples is not None:
        print(f"epoch: {where}; {shape.epoch_batches:,} batches x {shape.batch_size} per rank"
              f" = {shape.samples:,} samples")
    else:
        print(f"epoch: {where}; length not given (--batch-size and --epoch-batches give the "
              "per-epoch numbers)")
    if not listed:
        print("shards: not listed (--no-list): counts from brace patterns only, no sizes")
    print()
    for line in table_lines(spec, rows):
        print(line)
    if warnings:
        print()
        for warning in warnings:
            print(f"warning: {warning}")
    if sim is not None:
        print()
        for line in simulation_lines(sim):
            print(line)
