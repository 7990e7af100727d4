"""Per-shard tasks in parallel: packing a directory into shards (:func:`create_shards`) and
transforming shards (:func:`map_shards`), on this process, a ``concurrent.futures`` pool or a
Dask cluster, with retries and a report of every shard.

Results do not depend on the executor: each shard is planned before any is written, and
:class:`~wds_cloud.TarWriter` writes the same bytes for the same samples. Outputs are
written atomically, so a failed shard leaves nothing behind.
"""

from __future__ import annotations

from .create import (
    DirectoryScan,
    SampleFiles,
    ShardPlan,
    create_shards,
    plan_shards,
    scan_directory,
    shard_names,
    write_shard,
    write_shards,
)
from .executors import TaskOutcome, as_executor, open_executor, run_tasks
from .mapshards import map_shard, map_shards, output_urls
from .report import RunReport, ShardDone, ShardReport

__all__ = [
    "DirectoryScan",
    "RunReport",
    "SampleFiles",
    "ShardDone",
    "ShardPlan",
    "ShardReport",
    "TaskOutcome",
    "as_executor",
    "create_shards",
    "map_shard",
    "map_shards",
    "open_executor",
    "output_urls",
    "plan_shards",
    "run_tasks",
    "scan_directory",
    "shard_names",
    "write_shard",
    "write_shards",
]
