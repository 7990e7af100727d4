"""``wds-cloud map-shards MODULE:FUNCTION INPUTS --output PATTERN``: transform shards in
parallel, one task per shard (a thin layer over :func:`wds_cloud.map_shards`)."""

from __future__ import annotations

import argparse
import functools
import importlib
import os
import sys
from typing import Any

from ..errors import ConfigError, ShardTaskError
from ..parallel import map_shards, open_executor
from ..parallel.report import RunReport
from ..settings import human_size
from ..urls import redact, split_scheme
from .common import (
    OK,
    PROBLEMS,
    Input,
    Inputs,
    Progress,
    add_input_options,
    add_json_option,
    command_parser,
    emit_json,
    plural,
)
from .create import (
    add_executor_options,
    executor_kind,
    print_failures,
    shard_count,
    shard_range,
)

__all__ = ["add_parser", "cmd_map_shards", "load_function"]

_DESCRIPTION = """\
Run a Python function over the samples of many shards, one task per shard, and write one
output shard per input shard: webdataset's offline augmentation, on the processes of this
machine or on a Dask cluster. FUNCTION takes a sample (a dict: "__key__" and one field per
extension, bytes unless --decode) and returns a sample (without "__key__": the input's is
kept), None to drop it, or a list of samples. A failed shard is tried again (--retries); the
shards that still fail are named at the end, with no output written for them (outputs are
written atomically), and every other shard is written.

MODULE is imported by name, from the current directory too. Worker processes import it
likewise; Dask workers receive a module of the current directory with the function, and
import any other (which must then be installed on their machines).

examples:
  wds-cloud map-shards augment:flip 'shards/train-{000000..000099}.tar' --output aug/
  wds-cloud map-shards mypkg.aug:resize 's3://b/train-*.tar' \\
      --output 's3://b/small-%06d.tar' --decode pil --executor dask --workers 8"""


def add_parser(sub: Any) -> None:
    p = command_parser(sub, "map-shards", help="transform shards in parallel with a Python "
                       "function (offline augmentation)", description=_DESCRIPTION)
    p.add_argument("function", metavar="MODULE:FUNCTION",
                   help="the function to run on each sample, e.g. augment:flip or "
                   "mypkg.transforms:resize")
    add_input_options(p, what="shards to transform")
    p.add_argument("--output", required=True, metavar="PATTERN|DIR/",
                   help="where each shard goes: a pattern with a %%d field numbered in input "
                   "order (out/aug-%%06d.tar, s3://b/aug-%%06d.tar), or a directory ending "
                   "in / (or existing) that gets each input's file name")
    p.add_argument("--decode", nargs="?", const=True, default=False, metavar="IMAGES",
                   help="decode fields before calling FUNCTION (json, txt, cls, npy...) and "
                   "encode them back by extension; IMAGES decodes images too: pil, rgb8, "
                   "rgb, l8, torchrgb...")
    p.add_argument("--whole-shard", action="store_true",
                   help="FUNCTION takes the iterator of a shard's samples and returns an "
                   "iterable of samples")
    add_executor_options(p, local="processes")
    add_json_option(p)
    p.set_defaults(func=cmd_map_shards)


def load_function(spec: str) -> Any:
    """The function ``module:name`` (``name`` may be dotted: ``Class.method``); the current
    directory is searched as ``python -m`` would."""
    module_name, colon, attr = spec.partition(":")
    if not colon or not module_name or not attr:
        raise ConfigError(f"{spec!r}: expected MODULE:FUNCTION, e.g. augment:flip or "
                          "mypkg.transforms:resize")
    if module_name.endswith(".py") or "/" in module_name:
        raise ConfigError(f"{spec!r}: give the module's name (augment:flip), not a file, "
                          "and run from its directory (or install it)")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        value: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"cannot import {module_name!r} for {spec!r}: {exc}") from exc
    for part in attr.split("."):
        try:
            value = getattr(value, part)
        except AttributeError:
            raise ConfigError(f"{module_name!r} has no {attr!r} (for {spec!r})") from None
    if not callable(value):
        raise ConfigError(f"{spec!r} is {type(value).__name__}, not a function")
    return value


def _send_by_value(fn: Any) -> None:
    """Have Dask send the code of ``fn``'s module when it was found in the current directory
    (a script next to the data, not installed on the workers): map_shards sends a function
    to Dask with cloudpickle, which sends such a module by value."""
    module = sys.modules.get(getattr(fn, "__module__", "") or "")
    path = getattr(module, "__file__", None)
    if module is None or not path:
        return
    if os.path.abspath(path).startswith(os.getcwd() + os.sep):
        import cloudpickle

        cloudpickle.register_pickle_by_value(module)


def _into_directory(directory: str, url: str) -> str:
    return directory.rstrip("/") + "/" + url.rstrip("/").rpartition("/")[2]


def _outputs(output: str) -> Any:
    local = not split_scheme(output)[0]
    if output.endswith("/") or (local and "%" not in output and os.path.isdir(output)):
        return functools.partial(_into_directory, output)
    return output


def cmd_map_shards(args: argparse.Namespace) -> int:
    """Run ``wds-cloud map-shards``; the exit status."""
    fn = load_function(args.function)
    inputs = Inputs.from_args(args)
    shards = inputs.shards()
    if any(s.options != shards[0].options for s in shards):
        raise ConfigError("the inputs are read with different storage options (spec sources "
                          "with options of their own); run map-shards once per source")
    with open_executor(executor_kind(args), workers=args.workers, scheduler=args.scheduler,
                       processes=True) as executor, \
            Progress("mapping", unit="shard", total=len(shards),
                     enabled=not args.quiet) as progress:
        if executor_kind(args) == "dask":
            _send_by_value(fn)
        report = _run(fn, args, inputs, shards, executor, progress)
    print_failures(report, "map-shards")
    if args.json:
        emit_json({"function": args.function, "output": redact(args.output),
                   "executor": executor_kind(args), **report.to_json()})
    else:
        read = sum(s.samples_in or 0 for s in report.written)
        print(f"mapped {shard_count(report)}: {plural(read, 'sample')} in, {report.samples:,} out "
              f"({human_size(report.size)}) in {report.seconds:.2f} s"
              f"{shard_range(report.written)}")
    return OK if report.ok else PROBLEMS


def _run(fn: Any, args: argparse.Namespace, inputs: Inputs, shards: list[Input],
         executor: Any, progress: Progress) -> RunReport:
    """The report of the run, whether or not shards failed."""
    try:
        return map_shards(fn, [s.url for s in shards], _outputs(args.output),
                          executor=executor, retries=args.retries, decode=args.decode,
                          whole_shard=args.whole_shard, storage_options=dict(shards[0].options),
                          settings=inputs.settings,
                          on_shard=lambda shard: progress.update(1, shard.size))
    except ShardTaskError as exc:
        report: RunReport = exc.report
        return report
