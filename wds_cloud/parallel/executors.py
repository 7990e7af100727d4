"""Running one task per shard on an executor, with retries, and what came of each task.

An *executor* is ``None`` (run each task in this process, one after the other), a
:class:`concurrent.futures.Executor` (thread or process pool) or a Dask
``distributed.Client`` (recognized without importing Dask: a process that never imported
``distributed`` cannot hold a client). Dask tasks are submitted with ``pure=False``, so a
retried task runs again instead of returning the first attempt's cached error.

:func:`run_tasks` submits every task at once, resubmits a failed one until it has had
``retries`` more attempts, and always lets every other task finish: the caller gets one
:class:`TaskOutcome` per task, in task order, whatever the order they completed in.
:func:`open_executor` makes the executors of the command line (a thread or process pool, a
Dask ``LocalCluster`` on 127.0.0.1, or a client of a running scheduler) and closes them.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import functools
import logging
import multiprocessing
import os
import pickle
import re
import sys
import sysconfig
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..errors import (
    AccessDeniedError,
    ConfigError,
    MissingDependencyError,
    OpenError,
    ShardNotFoundError,
    UnsafeURLError,
)
from ..settings import Settings
from ..urls import split_scheme

__all__ = ["PERMANENT_ERRORS", "CloudPickled", "TaskOutcome", "as_executor", "check_picklable",
           "for_executor", "open_executor", "run_tasks", "task_settings", "where_workers_see"]

log = logging.getLogger(__name__)

#: messages of failed attempts are cut to this many characters
_MESSAGE_LIMIT = 500
#: errors another attempt cannot fix: not retried
PERMANENT_ERRORS = (ConfigError, ShardNotFoundError, AccessDeniedError, MissingDependencyError,
                    UnsafeURLError)


@dataclass
class TaskOutcome:
    """What came of one task: ``value`` is what its last attempt returned (None if every
    attempt failed); ``errors`` holds one message per failed attempt, in order."""

    name: str
    value: Any = None
    attempts: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        """Every attempt failed (the task has no result)."""
        return self.attempts > 0 and len(self.errors) == self.attempts

    @property
    def error(self) -> str | None:
        """The last attempt's error, if the task failed."""
        return self.errors[-1] if self.failed else None


def describe_error(exc: BaseException) -> str:
    """``KeyError: 'txt' (at augment.py:6, in flip)``: the error, cut to a readable length,
    and where the caller's own code raised it, if it did."""
    text = f"{type(exc).__name__}: {exc}"
    if len(text) > _MESSAGE_LIMIT:
        text = text[:_MESSAGE_LIMIT] + "..."
    where = _user_frame(exc)
    return f"{text} (at {where})" if where else text


#: ``File "...", line N, in f`` lines of a traceback's text (a process pool's remote one)
_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')


def _user_frame(exc: BaseException) -> str | None:
    """``file.py:LINE, in name`` of the innermost frame in neither Python's library, an
    installed package nor wds_cloud; a process pool's error carries its worker's traceback
    as the text of its ``__cause__``."""
    frames = [(f.filename, f.lineno, f.name) for f in traceback.extract_tb(exc.__traceback__)]
    cause = exc.__cause__
    if cause is not None and type(cause).__name__ == "_RemoteTraceback":
        frames += [(m[0], int(m[1]), m[2]) for m in _FRAME.findall(str(cause))]
    ours = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    library = {sysconfig.get_path(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    for filename, line, name in reversed(frames):
        path = os.path.abspath(filename)
        if not path.startswith(ours) and not any(path.startswith(p) for p in library if p) \
                and not filename.startswith("<"):
            return f"{os.path.basename(path)}:{line}, in {name}"
    return None


def task_settings(settings: Settings | None) -> Settings:
    """The settings sent with each task: the caller's (or the environment's, read once here),
    without the copy of the environment (it may hold secrets, and tasks may run on other
    machines) and without the shard cache (each shard is read or written once)."""
    settings = settings or Settings.from_env()
    return replace(settings, environ={}, cache_dir=None)


def where_workers_see(url: str) -> str:
    """``url`` as a worker in another directory (a Dask worker) finds it: local paths made
    absolute; URLs as they are."""
    return os.path.abspath(url) if not split_scheme(url)[0] and url != "-" else url


def is_dask_client(executor: object) -> bool:
    """Whether ``executor`` is a ``distributed.Client`` (without importing Dask)."""
    distributed = sys.modules.get("distributed")
    client = getattr(distributed, "Client", None) if distributed is not None else None
    return isinstance(client, type) and isinstance(executor, client)


def as_executor(executor: Any) -> cf.Executor | None:
    """``executor`` as a :class:`concurrent.futures.Executor` (a Dask client's own
    ``get_executor(pure=False)``), or None to run in this process; anything else is a
    :class:`ConfigError`."""
    if executor is None or isinstance(executor, cf.Executor):
        return executor
    if is_dask_client(executor):
        return executor.get_executor(pure=False)
    raise ConfigError(
        f"executor={executor!r} is not understood: pass None (run in this process), a "
        "concurrent.futures.Executor (ThreadPoolExecutor, ProcessPoolExecutor) or a Dask "
        "distributed.Client")


class CloudPickled:
    """A callable sent to Dask workers as cloudpickle bytes, loaded when first called: a
    function the workers cannot load (its module is not installed there) fails its tasks
    with an error naming the module, instead of breaking the worker's connection (where
    Dask waits for the task forever). Functions of modules registered with
    ``cloudpickle.register_pickle_by_value`` travel with their code."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        import cloudpickle

        self.fn: Callable[..., Any] | None = fn
        self.payload = cloudpickle.dumps(fn)
        self.name = getattr(fn, "__qualname__", repr(fn))

    def __getstate__(self) -> dict[str, Any]:
        return {"payload": self.payload, "name": self.name}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, fn=None)

    def __call__(self, *args: Any, **kw: Any) -> Any:
        if self.fn is None:
            self.fn = pickle.loads(self.payload)
        return self.fn(*args, **kw)

    def __repr__(self) -> str:
        return f"CloudPickled({self.name})"


def for_executor(fn: Callable[..., Any], executor: Any) -> Callable[..., Any]:
    """``fn`` as it is best sent to ``executor``'s workers: wrapped in :class:`CloudPickled`
    for Dask, as it is for the others."""
    return CloudPickled(fn) if is_dask_client(executor) else fn


def check_picklable(value: Any, executor: Any, what: str) -> None:
    """Refuse, before anything runs, a ``value`` a process pool could not send to its workers
    (threads and this process need no pickling; Dask pickles with cloudpickle, which takes
    lambdas and local functions too)."""
    if executor is None or isinstance(executor, cf.ThreadPoolExecutor) \
            or is_dask_client(executor):
        return
    try:
        pickle.dumps(value)
    except Exception as exc:
        raise ConfigError(
            f"{what} {value!r} cannot be sent to the workers of {type(executor).__name__} "
            f"({describe_error(exc)}): define it at the top level of a module (not a lambda "
            "or a nested function; functools.partial of such a function works), or use a "
            "ThreadPoolExecutor or a Dask client") from exc


def run_tasks(
    fn: Callable[[Any], Any], jobs: Sequence[tuple[str, Any]], *, executor: Any = None,
    retries: int = 2, on_outcome: Callable[[TaskOutcome], None] | None = None,
) -> list[TaskOutcome]:
    """Run ``fn(job)`` for each ``(name, job)`` of ``jobs`` on ``executor``; a task that raises
    is run again, up to ``retries`` more times, unless its error is one another attempt cannot
    fix (:data:`PERMANENT_ERRORS`: a missing shard, access denied, a bad argument).
    ``on_outcome`` is called in this process as each task is done for good (succeeded, or out
    of attempts). One outcome per job, in the order of ``jobs``. Ctrl-C cancels the tasks not
    started yet and is raised."""
    if retries < 0:
        raise ConfigError(f"retries must be >= 0, got {retries}")
    pool = as_executor(executor)
    outcomes = [TaskOutcome(name) for name, _ in jobs]
    done = on_outcome or (lambda outcome: None)
    if pool is None:
        for (_, job), outcome in zip(jobs, outcomes, strict=True):
            while _attempt(outcome, retries, functools.partial(fn, job)):
                pass
            done(outcome)
        return outcomes
    _run_on(pool, fn, jobs, outcomes, retries, done)
    return outcomes


def _attempt(outcome: TaskOutcome, retries: int, call: Callable[[], Any]) -> bool:
    """Run one attempt in this process; True if the task should be tried again."""
    outcome.attempts += 1
    try:
        outcome.value = call()
        return False
    except Exception as exc:
        return _failed(outcome, exc, retries)


def _failed(outcome: TaskOutcome, exc: BaseException, retries: int) -> bool:
    """Record a failed attempt; True if the task has attempts left."""
    outcome.errors.append(describe_error(exc))
    again = outcome.attempts <= retries and not isinstance(exc, PERMANENT_ERRORS)
    log.info("%s: attempt %d failed (%s)%s",
            outcome.name, outcome.attempts, outcome.errors[-1],
            "; trying again" if again else "; giving up")
    return again


def _run_on(pool: cf.Executor, fn: Callable[[Any], Any], jobs: Sequence[tuple[str, Any]],
            outcomes: list[TaskOutcome], retries: int,
            done: Callable[[TaskOutcome], None]) -> None:
    pending: dict[cf.Future[Any], int] = {}

    def submit(i: int) -> None:
        outcomes[i].attempts += 1
        pending[pool.submit(fn, jobs[i][1])] = i

    try:
        for i in range(len(jobs)):
            submit(i)
        while pending:
            finished, _ = cf.wait(pending, return_when=cf.FIRST_COMPLETED)
            for future in finished:
                i = pending.pop(future)
                exc = future.exception()
                if exc is None:
                    outcomes[i].value = future.result()
                elif _failed(outcomes[i], exc, retries):
                    submit(i)
                    continue
                done(outcomes[i])
    except BaseException:
        for future in pending:
            future.cancel()
        raise


# -- the executors of the command line ------------------------------------------------------

@contextlib.contextmanager
def open_executor(kind: str = "local", *, workers: int = 1, scheduler: str | None = None,
                  processes: bool = False) -> Iterator[Any]:
    """An executor for :func:`run_tasks`, closed on exit.

    ``kind="local"``: None (this process) for one worker, else a pool of ``workers`` threads,
    or processes when ``processes`` (started with ``forkserver`` where there is one, so no
    worker inherits a lock or an event loop thread of this process). ``kind="dask"``: a
    ``distributed.Client`` of ``scheduler`` (an address such as ``tcp://10.0.0.5:8786``), or
    without one of a new ``LocalCluster`` of ``workers`` single-threaded processes on
    127.0.0.1 with no dashboard. Dask missing is a :class:`MissingDependencyError` naming the
    ``dask`` extra."""
    if kind == "local":
        if scheduler is not None:
            raise ConfigError("a scheduler address goes with the dask executor (--executor dask)")
        if workers <= 1:
            yield None
            return
        pool: cf.Executor
        if processes:
            methods = multiprocessing.get_all_start_methods()
            context = multiprocessing.get_context(
                "forkserver" if "forkserver" in methods else "spawn")
            pool = cf.ProcessPoolExecutor(workers, mp_context=context)
        else:
            pool = cf.ThreadPoolExecutor(workers, thread_name_prefix="wds-shard")
        with pool:
            yield pool
        return
    if kind != "dask":
        raise ConfigError(f"unknown executor {kind!r}: use 'local' or 'dask'")
    with _dask_client(workers, scheduler) as client:
        yield client


@contextlib.contextmanager
def _dask_client(workers: int, scheduler: str | None) -> Iterator[Any]:
    try:
        import distributed
    except ImportError as exc:
        raise MissingDependencyError("the dask executor", "distributed", "dask") from exc
    with _quiet("distributed"):
        if scheduler is not None:
            try:
                client = distributed.Client(scheduler)
            except OSError as exc:  # distributed's TimeoutError is an OSError
                raise OpenError(f"cannot reach the Dask scheduler at {scheduler!r}: "
                                f"{describe_error(exc)}; check the address (tcp://HOST:8786) "
                                "and that the scheduler is running", url=scheduler) from exc
            with client:
                yield client
            return
        # the scheduler's HTTP server (health, metrics) starts even without a dashboard: on
        # loopback, on a free port; a failed task is reported by run_tasks, not by the workers
        cluster = distributed.LocalCluster(
            n_workers=max(workers, 1), threads_per_worker=1, processes=True,
            host="127.0.0.1", dashboard_address="127.0.0.1:0", silence_logs=logging.CRITICAL)
        with cluster, distributed.Client(cluster) as client:
            yield client


@contextlib.contextmanager
def _quiet(name: str, level: int = logging.WARNING) -> Iterator[None]:
    """Logger ``name`` at ``level`` at least, for the duration (Dask sets its loggers to INFO,
    and they propagate to the application's handlers)."""
    logger = logging.getLogger(name)
    before = logger.level
    logger.setLevel(max(before, level))
    try:
        yield
    finally:
        logger.setLevel(before)
