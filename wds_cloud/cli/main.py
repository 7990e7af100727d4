"""``wds-cloud``: list, inspect, benchmark and create WebDataset shards, transform them in
parallel, look after a shard cache, check dataset specs, serve a local S3 server and run the
demo job.

``main.py`` builds the parser from one module per command (each has ``add_parser(sub)``),
importing only the module of the command run; the commands sit on top of the public API
(``import wds_cloud as wds``). The CLI is the only part of the package that prints. Only the
commands that hand data to torch (``bench --workers``, ``demo``) import torch.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import re
import sys
from collections.abc import Sequence

from ..errors import (
    ConfigError,
    MissingDependencyError,
    OpenError,
    UnsafeURLError,
    UnsupportedSchemeError,
    WdsCloudError,
)
from .common import EXIT_CODES, INTERRUPTED, OK, PROBLEMS, UNUSABLE, Formatter

__all__ = ["build_parser", "main"]

#: the module under ``wds_cloud.cli`` of each command, in the order ``--help`` lists them
_MODULES = {"ls": "ls", "inspect": "inspect", "head": "head", "bench": "bench",
            "create": "create", "map-shards": "mapshards", "cache": "cache", "spec": "spec",
            "serve-s3": "serve_s3", "demo": "demo"}
COMMANDS = tuple(_MODULES.values())

_DESCRIPTION = """\
Work with WebDataset shards wherever they are: local paths, s3://, gs://, az://, http(s)://,
ais://, pipe: commands. Every command that reads shards takes paths, URLs, brace patterns,
globs and dataset specs, and storage options (-o KEY=VALUE or --storage-options JSON).

examples:
  wds-cloud ls 's3://bucket/train-*.tar' -o endpoint_url=http://127.0.0.1:9000
  wds-cloud inspect 'shards/train-{000000..000009}.tar' --all
  wds-cloud head shards/train-000000.tar -n 3
  wds-cloud bench config/train.yaml --workers 4 --plot bench.png
  wds-cloud create ./images --output 'out/train-%06d.tar' --maxsize 100MB --workers 4
  wds-cloud serve-s3 ./buckets --port 9000

Run 'wds-cloud COMMAND --help' for a command's options."""


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser of every command; given a command line ``argv`` that names a command, of
    that one only. A command's module may cost a tenth of a second to import (numpy, the
    cache, the executors): ``head -n 1`` must not pay for them all. ``--help`` lists them
    all."""
    parser = argparse.ArgumentParser(prog="wds-cloud", description=_DESCRIPTION,
                                     epilog=EXIT_CODES, formatter_class=Formatter)
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="more logging (-vv: debug); also after the command")
    parser.add_argument("-q", "--quiet", action="store_true", default=False,
                        help="no progress bars; also after the command")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    named = _command_in(argv or ())
    for name in COMMANDS if named is None else (_MODULES[named],):
        importlib.import_module(f"{__package__}.{name}").add_parser(sub)
    return parser


def _command_in(argv: Sequence[str]) -> str | None:
    """The command ``argv`` runs, if it names one: its first word that is not an option (the
    options before the command take no value)."""
    word = next((a for a in argv if not a.startswith("-")), None)
    return word if word in _MODULES else None


def exit_status(exc: WdsCloudError) -> int:
    """Input that cannot be found, reached or used as given: 2; problems found in it: 1."""
    unusable = (ConfigError, OpenError, UnsupportedSchemeError, MissingDependencyError,
                UnsafeURLError)
    return UNUSABLE if isinstance(exc, unusable) else PROBLEMS


_WORKER = re.compile(r"^Caught \w+ in (DataLoader worker process \d+)\.\n"
                     r"Original Traceback \(most recent call last\):\n", re.S)


def error_message(exc: BaseException) -> str:
    """``exc``'s message for a user: an error raised in a DataLoader worker comes back with the
    worker's traceback in its message (torch's ``ExceptionWrapper``); keep its last line, the
    original message, and say which worker."""
    text = str(exc)
    found = _WORKER.match(text)
    if found is None:
        return text
    last = text.rstrip().rsplit("\n", 1)[-1]
    name = type(exc).__name__
    for prefix in (f"{type(exc).__module__}.{name}: ", f"{name}: "):
        last = last.removeprefix(prefix)
    return f"{last} (in {found.group(1)})"


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv).parse_args(argv)
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args))
    except WdsCloudError as exc:
        print(f"wds-cloud {args.command}: error: {error_message(exc)}", file=sys.stderr)
        return exit_status(exc)
    except KeyboardInterrupt:
        print(f"wds-cloud {args.command}: interrupted", file=sys.stderr)
        return INTERRUPTED
    except BrokenPipeError:
        # the reader of stdout went away (``wds-cloud ls ... | head``): stop quietly, and keep
        # Python from complaining again when it flushes stdout at exit
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return OK
