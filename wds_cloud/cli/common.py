"""What the commands share: their parsers' common options, storage options, what a command
reads (:class:`Inputs`), progress bars, ``--json`` output and exit codes."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, BinaryIO, TextIO

from ..errors import ConfigError
from ..settings import Settings, human_size, parse_size
from ..urls import merge_scheme_options, split_scheme

if TYPE_CHECKING:
    from ..router import Router
    from ..spec import DatasetSpec, SourceSpec

__all__ = [
    "INTERRUPTED", "OK", "PROBLEMS", "UNUSABLE", "Formatter", "Input", "Inputs", "Progress",
    "add_input_options", "add_json_option", "command_parser", "count_arg", "emit_json",
    "plural", "size_arg", "source_options", "storage_options",
]

#: exit status: done, nothing wrong
OK = 0
#: the command ran and found problems: anomalies, bad cache entries, failed shards, a bad spec
PROBLEMS = 1
#: bad arguments, or an input that cannot be found, reached or read as asked (argparse's 2 too)
UNUSABLE = 2
#: stopped by Ctrl-C
INTERRUPTED = 130

EXIT_CODES = f"""\
exit status: {OK} done; {PROBLEMS} problems found (anomalies, corrupt shards, failed shards,
bad cache entries); {UNUSABLE} bad arguments, or an input that cannot be found, reached or
read as asked; {INTERRUPTED} interrupted."""


class Formatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions as written (they hold examples); defaults shown where there is one."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if ("%(default)" in text or default is None or default is False
                or default == argparse.SUPPRESS
                or isinstance(default, (list, tuple, dict)) or not action.option_strings):
            return text
        return f"{text} (default: %(default)s)"


def _shared() -> argparse.ArgumentParser:
    """``-v``/``-q``, accepted before or after the command (the command's value wins)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("-v", "--verbose", action="count", default=argparse.SUPPRESS,
                   help="more logging (-vv: debug)")
    p.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS,
                   help="no progress bars")
    return p


def command_parser(sub: Any, name: str, *, help: str, description: str | None = None,
                   epilog: str | None = EXIT_CODES) -> argparse.ArgumentParser:
    """A command's parser on the subparsers ``sub``, with ``-v``/``-q`` and the help style of
    every command."""
    return sub.add_parser(
        name, help=help, description=description or help[:1].upper() + help[1:] + ".",
        epilog=epilog, parents=[_shared()], formatter_class=Formatter)


def size_arg(text: str) -> int:
    """An argparse type: bytes as ``1e9``, ``50GB``, ``500MiB``, ``1MB`` or a plain number."""
    try:
        return parse_size(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(
            f"cannot read {text!r} as a size; write e.g. 1MB, 500MiB, 1e9 or 50GB") from exc


def count_arg(low: int = 0) -> Any:
    """An argparse type: an integer ≥ ``low``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {value}")
        return value
    parse.__name__ = "integer"
    return parse


def plural(n: int, word: str, many: str | None = None) -> str:
    """``1 sample``, ``3 samples``, ``2 entries`` (``many`` for irregular plurals)."""
    return f"{n:,} {word if n == 1 else (many or word + 's')}"


def add_json_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true",
                   help="print one JSON document on stdout instead of text (for scripts)")


def emit_json(document: Any, stream: TextIO | None = None) -> None:
    """The ``--json`` output: one document, keys in a stable order."""
    json.dump(document, stream or sys.stdout, indent=2, default=str)
    (stream or sys.stdout).write("\n")


# -- storage options ------------------------------------------------------------------------

def add_input_options(p: argparse.ArgumentParser, *, inputs: bool = True,
                      what: str = "shards to read") -> None:
    """The positional inputs (if ``inputs``) and the storage options of a command that opens
    URLs."""
    if inputs:
        p.add_argument("inputs", nargs="+", metavar="URL|SPEC",
                       help=f"{what}: paths or URLs, brace patterns (a-{{000..009}}.tar), "
                       "globs (shards/train-*.tar, s3://bucket/train-*.tar, quoted), "
                       "directories and prefixes (shards/, s3://bucket/train/), "
                       "'a.tar::b.tar' lists, or a dataset spec (.yaml/.yml/.json)")
    p.add_argument("-o", "--option", action="append", default=[], metavar="KEY=VALUE",
                   dest="options",
                   help="a storage option for fsspec (repeatable): endpoint_url=http://..., "
                   "anon=true; prefix a scheme for one store only: s3.endpoint_url=..., "
                   "gs.token=anon; dots nest (s3.client_kwargs.region_name=eu-west-1); "
                   "values are JSON if they parse as JSON, else strings")
    p.add_argument("--storage-options", metavar="JSON", default=None,
                   help="storage options as JSON, flat ({\"anon\": true}) or per scheme "
                   "({\"s3\": {\"endpoint_url\": ...}}); -o options are merged into them")


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def storage_options(args: argparse.Namespace) -> dict[str, Any]:
    """The storage options of ``--storage-options JSON`` and ``-o KEY=VALUE`` (which win).

    Raises :class:`ConfigError` naming the option that cannot be read."""
    options: dict[str, Any] = {}
    if getattr(args, "storage_options", None):
        try:
            options = json.loads(args.storage_options)
        except ValueError as exc:
            raise ConfigError(f"--storage-options: not valid JSON ({exc}): "
                              f"{args.storage_options!r}") from exc
        if not isinstance(options, dict):
            raise ConfigError("--storage-options: expected a JSON object, got "
                              f"{args.storage_options!r}")
    for item in getattr(args, "options", None) or []:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise ConfigError(f"-o {item!r}: expected KEY=VALUE, e.g. -o "
                              "endpoint_url=http://127.0.0.1:9000")
        *path, last = key.strip().split(".")
        where = options
        for part in path:
            nested = where.setdefault(part, {})
            if not isinstance(nested, dict):
                raise ConfigError(f"-o {item!r}: {part!r} is already set to a value")
            where = nested
        where[last] = _value(value)
    return options


def _per_scheme(options: Mapping[str, Any], schemes: Sequence[str]) -> dict[str, Any]:
    """``options`` per scheme: flat options (no key is a registered scheme) go to each of
    ``schemes``."""
    if not options:
        return {}
    from ..io import registry

    known = set(registry.registered_schemes())
    if any(key in known for key in options):
        return dict(options)
    return {scheme: dict(options) for scheme in schemes if scheme}


# -- what a command reads -------------------------------------------------------------------

@dataclass(frozen=True)
class Input:
    """One shard to read: its URL, the spec source it belongs to (if any) and the storage
    options it is opened with."""

    url: str
    source: str | None = None
    options: Mapping[str, Any] = field(default_factory=dict)


class Inputs:
    """What a command reads, from its command-line inputs: paths and URLs, brace patterns,
    ``::`` lists, local and bucket globs (listed once, sorted, where the shards are read from),
    directories and bucket prefixes (``s3://b/train/``: the shards directly in them) and
    dataset specs (each source listed with its own storage options).

    The settings are read once, here (the CLI is a composition root)."""

    def __init__(self, inputs: Sequence[str], *, options: Mapping[str, Any] | None = None,
                 settings: Settings | None = None) -> None:
        self.given = list(inputs)
        self.options = dict(options or {})
        self.settings = settings or Settings.from_env()
        self._routers: dict[str, Router] = {}

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Inputs:
        return cls(args.inputs, options=storage_options(args))

    def router(self, options: Mapping[str, Any]) -> Router:
        """The router for shards opened with ``options`` (one per distinct options)."""
        from ..router import Router

        key = json.dumps(options, sort_keys=True, default=str)
        if key not in self._routers:
            self._routers[key] = Router(self.settings, dict(options))
        return self._routers[key]

    def shards(self) -> list[Input]:
        """Every shard the inputs name, in order (globs listed now)."""
        found: list[Input] = []
        for given in self.given:
            found.extend(self._spec_shards(given) if _is_spec(given) else self._url_shards(given))
        return found

    def _url_shards(self, given: str) -> list[Input]:
        from ..router import expand_glob
        from ..shardsource import prefix_shards
        from ..urls import expand_urls

        urls = expand_urls(given, url_vars=self.settings.url_vars)
        options = _per_scheme(self.options, sorted({_scheme(u) for u in urls}))
        router = self.router(options)
        urls = [found for url in urls
                for found in (prefix_shards(url, router) if _is_directory(url) else
                              expand_glob([url], router=router))]
        if not urls:
            raise ConfigError(f"{given!r} matches no shards")
        return [Input(url, None, options) for url in urls]

    def _spec_shards(self, given: str) -> list[Input]:
        from ..spec import load_spec
        from ..specdataset import spec_opener
        from ..specshards import list_source

        spec = load_spec(given, environ=self.settings.environ, allow_pipe=True,
                         open_stream=spec_opener(self.settings, self.options))
        found: list[Input] = []
        for source in spec.sources:
            options = source_options(self.options, spec, source)
            urls = list_source(spec, source, self.router(options)).urls
            if not urls:
                raise ConfigError(f"{spec.origin}: {source.key or source.name}: "
                                  f"{source.pattern!r} matches no shards")
            found.extend(Input(url, source.name, options) for url in urls)
        return found

    def open(self, shard: Input, **kw: Any) -> BinaryIO:
        """A byte stream of ``shard`` (rewrite, AIStore, cache, opener: as a dataset opens it)."""
        return self.router(shard.options).open(shard.url, "rb", **kw)

    def samples(self, shards: Sequence[Input], *, handler: Any = None) -> Iterator[dict[str, Any]]:
        """The raw samples of ``shards``, in order (read ahead as a dataset reads them)."""
        from ..handlers import reraise_exception
        from ..reading import ShardOpener

        for options, group in _runs(shards):
            opener = ShardOpener(self.settings, options)
            items = [{"url": s.url} for s in group]
            yield from opener.samples(items, handler or reraise_exception, None, None)



def _is_directory(url: str) -> bool:
    """A directory or bucket prefix: a URL ending in ``/``, or an existing local directory."""
    if url.endswith("/") and url != "/":
        return True
    scheme = _scheme(url)
    return scheme in ("", "file") and url != "-" and os.path.isdir(
        url.removeprefix("file://") if scheme == "file" else url)


def _is_spec(given: str) -> bool:
    """A spec file; a glob (``s3://b/specs/*.yaml``) names files to list, not one spec."""
    from ..spec.schema import is_spec_path

    return is_spec_path(given) and not any(c in given.partition("#")[0] for c in "*?[")


def _scheme(url: str) -> str:
    return "-" if url == "-" else split_scheme(url)[0]


def source_options(options: Mapping[str, Any], spec: DatasetSpec,
                   source: SourceSpec) -> dict[str, Any]:
    """The storage options ``source`` of ``spec`` is read with: the command line's (flat ones
    for each scheme the source uses), then the spec's, then the source's, per scheme and key
    (later wins, as ``WebDataset(spec, storage_options=...)`` merges them)."""
    schemes = sorted({_scheme(u) for u in source.urls})
    return merge_scheme_options(_per_scheme(options, schemes), spec.storage_options,
                                source.storage_options)


def _runs(shards: Sequence[Input]) -> Iterator[tuple[Mapping[str, Any], list[Input]]]:
    """Consecutive shards with the same options, grouped."""
    group: list[Input] = []
    for shard in shards:
        if group and shard.options != group[0].options:
            yield group[0].options, group
            group = []
        group.append(shard)
    if group:
        yield group[0].options, group


# -- progress -------------------------------------------------------------------------------

class Progress:
    """A tqdm bar on stderr (shown only on a terminal, after the first second, so that its
    first rates are not absurd), and the final numbers for a ``throughput:`` line.

    Rates in :meth:`summary` are measured from the first item on; :attr:`startup` is the time
    until it (imports, workers, first bytes)."""

    def __init__(self, label: str, *, unit: str = "sample", total: int | None = None,
                 enabled: bool = True, stream: TextIO | None = None) -> None:
        from tqdm import tqdm

        self.unit = unit
        self.created = self.start = time.perf_counter()
        self.startup: float | None = None
        self.count = 0
        self.nbytes = 0
        self._shown = 0.0
        stream = stream or sys.stderr
        self.bar = tqdm(total=total, desc=label, unit=f" {unit}s" if unit else "it",
                        unit_scale=True, delay=1.0, mininterval=0.5, file=stream,
                        leave=False, dynamic_ncols=True,
                        disable=not (enabled and stream.isatty()))

    def update(self, n: int = 1, nbytes: int = 0) -> None:
        now = time.perf_counter()
        if self.startup is None:
            self.startup = now - self.created
            self.start = now
        self.count += n
        self.nbytes += nbytes
        if nbytes and now - self._shown > 0.5:
            self._shown = now
            rate = self.nbytes / max(now - self.start, 1e-3) / 1e6
            self.bar.set_postfix_str(f"{human_size(self.nbytes)}, {rate:,.1f} MB/s",
                                     refresh=False)
        self.bar.update(n)

    @property
    def seconds(self) -> float:
        return max(time.perf_counter() - self.start, 1e-9)

    def summary(self) -> str:
        """``1,000 samples, 3.1 MiB in 0.52 s (first after 0.10 s): 1,923 samples/s, 6.2 MB/s``"""
        dt = self.seconds
        size = f", {human_size(self.nbytes)}" if self.nbytes else ""
        rate = f", {self.nbytes / dt / 1e6:,.1f} MB/s" if self.nbytes else ""
        startup = f" (first after {self.startup:.2f} s)" if self.startup is not None else ""
        return (f"{plural(self.count, self.unit)}{size} in {dt:.2f} s{startup}: "
                f"{self.count / dt:,.0f} {self.unit}s/s{rate}")

    def close(self) -> None:
        self.bar.close()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
