"""New Python processes without a new interpreter's imports: a *zygote* imports the heavy
third-party modules once (torch, numpy, the cloud SDKs: ~2.5 s of CPU in every fresh
interpreter), then forks a child for each ``python -c CODE``, ``python SCRIPT`` or
``python -m MODULE`` a test asks for. :meth:`Zygote.run` takes and returns what
``subprocess.run`` does.

For tests that need a process of their own (a job killed and resumed, a launcher, a process
whose state no earlier test has touched), not a fresh interpreter: a test of what an import
does or does not load (``test_layering``, ``test_no_torch``) runs ``subprocess`` itself.

A child is what ``python ARGS`` would be, as far as a test can tell:

- it is forked before anything but the listed modules ran: wds_cloud is imported afresh by
  each child, no client, thread, event loop or fork hook exists yet;
- it takes the request's environment exactly, its directory, its stdin, stdout and stderr
  (passed over the socket), ``sys.argv`` and ``sys.path[0]`` as ``python`` sets them, and
  runs the code at the top level of the zygote's script in a fresh ``__main__``, so that
  exceptions, ``SystemExit``, atexit handlers and the joining of threads at the end are the
  interpreter's own;
- it starts a new session (a timeout kills its whole process group), seeds numpy's global
  generator anew (Python's ``random`` reseeds itself after a fork) and makes its standard
  streams as ``python`` would for the file descriptors it got (``-u``,
  ``PYTHONUNBUFFERED``).

What a fork cannot change falls back to ``subprocess.run``: other interpreter options than
``-u``, or ``PYTHON*`` variables that differ from the zygote's (``sys.path``, hashing,
warnings and bytecode are fixed at its start).

The zygote is single-threaded whenever it forks (it starts no threads; OpenBLAS, loaded with
numpy, stops the pool it starts at import before any fork: a warm-up fork does it once, and
each request checks it). It serves requests on a UNIX socket, each on a connection of its own
(``{"argv", "env", "cwd", "unbuffered"}`` with three file descriptors; it answers the
child's pid, then its exit code as ``subprocess`` gives it), so that several children may run
at once and several pytest-xdist workers share one zygote (:func:`shared`). It exits when the
process it watches (the pytest run) is gone.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: the third-party modules of the cloud stores (without torch and numpy, whose presence
#: wds_cloud notices in ``sys.modules``)
NETWORK = ["yaml", "tqdm", "fsspec", "aiohttp", "botocore.session", "aiobotocore.session",
           "s3fs", "gcsfs", "adlfs"]
#: what :func:`shared`'s zygote imports: what the tests' children import that costs
HEAVY = [*NETWORK, "numpy", "PIL.Image", "torch", "torch.distributed.run"]
#: environment variables Python reads only when it starts (a child keeps the zygote's)
_FIXED_AT_START = "PYTHON"
_HANDLED = {"PYTHONUNBUFFERED"}


# ---- the zygote process (run as ``python -c SOURCE SOCKET WATCH MODULE...``) ----

def _fixed(env: dict[str, str]) -> dict[str, str]:
    """The variables of ``env`` that Python reads only when it starts."""
    return {k: v for k, v in env.items() if k.startswith(_FIXED_AT_START) and k not in _HANDLED}


def _recv_exactly(conn: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _address(path: str) -> str:
    """The abstract UNIX socket (Linux) of the zygote whose ready file is ``path``: no length
    limit on ``path``, nothing left behind."""
    return "\0wds-zygote-" + hashlib.sha1(os.path.abspath(path).encode()).hexdigest()[:24]


def _serve(path: str, watch: int) -> tuple[dict[str, Any], list[int]]:
    """Serves until ``watch`` is gone; returns, in a forked child only, its request and fds."""
    import importlib

    pid = os.fork()  # warm-up: atfork handlers (OpenBLAS's) stop their threads
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(_address(path))
    listener.listen(64)
    with open(path + ".new", "w") as mark:  # what a child cannot change (Zygote.forks)
        json.dump({"pid": os.getpid(), "fixed": _fixed(dict(os.environ))}, mark)
    os.rename(path + ".new", path)  # ready: a client that finds the path can connect
    waiting: dict[int, socket.socket] = {}
    importlib.invalidate_caches()
    while True:
        clients = {conn.fileno(): pid for pid, conn in waiting.items()}
        ready, _, _ = select.select([listener.fileno(), wake_r, *clients], [], [], 1.0)
        try:
            os.kill(watch, 0)
        except ProcessLookupError:
            os._exit(0)
        if wake_r in ready:
            os.read(wake_r, 4096)
        for fd in set(ready) & set(clients):  # the client hung up (killed): so does its child
            with contextlib.suppress(ProcessLookupError):
                os.killpg(clients[fd], signal.SIGKILL)
        while waiting:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            conn = waiting.pop(pid, None)
            if conn is not None:
                with contextlib.suppress(OSError):
                    conn.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
                conn.close()
        if listener.fileno() not in ready:
            continue
        conn, _ = listener.accept()
        try:
            header, fds, _, _ = socket.recv_fds(conn, 4, 3)
            (size,) = struct.unpack("!I", header + _recv_exactly(conn, 4 - len(header)))
            request = json.loads(_recv_exactly(conn, size))
        except (EOFError, OSError, struct.error, ValueError):
            conn.close()
            continue
        if _threads() != 1:
            raise RuntimeError(f"the zygote runs {_threads()} threads: it cannot fork cleanly")
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            for fd in (wake_r, wake_w, listener.fileno(), conn.fileno(),
                       *(c.fileno() for c in waiting.values())):
                os.close(fd)
            return request, fds
        for fd in fds:
            os.close(fd)
        conn.sendall(f"{pid}\n".encode())
        waiting[pid] = conn


def _become(request: dict[str, Any], fds: list[int]) -> dict[str, Any]:
    """This child as ``python ARGV``; returns the namespace of its fresh ``__main__``."""
    import io
    import types

    os.setsid()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in set(fds) - {0, 1, 2}:
        os.close(fd)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    unbuffered = request["unbuffered"] or bool(os.environ.get("PYTHONUNBUFFERED"))
    for name, fd, errors in (("stdout", 1, "strict"), ("stderr", 2, "backslashreplace")):
        stream = getattr(sys, name)
        tty = os.isatty(fd)
        raw = open(fd, "wb", buffering=0 if unbuffered else -1, closefd=False)  # noqa: SIM115
        setattr(sys, name, io.TextIOWrapper(
            raw, encoding=stream.encoding, errors=errors,
            line_buffering=tty or name == "stderr", write_through=unbuffered))
    stdin = open(0, "rb", closefd=False)  # noqa: SIM115
    sys.stdin = io.TextIOWrapper(stdin, encoding=sys.stdin.encoding)
    if "multiprocessing.process" in sys.modules:  # where spawned children start
        sys.modules["multiprocessing.process"].ORIGINAL_DIR = os.getcwd()  # type: ignore
    if "numpy" in sys.modules:  # a fresh process seeds numpy's global generator anew
        sys.modules["numpy"].random.seed()
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if "torch" in sys.modules and threads.isdigit():  # read by torch's import, in a fresh one
        sys.modules["torch"].set_num_threads(int(threads))
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = __builtins__
    sys.modules["__main__"] = main
    return main.__dict__


def _main_code(request: dict[str, Any]) -> str:
    """What the child runs at the zygote's top level, with ``sys.argv`` and ``sys.path[0]``
    set as ``python ARGV`` sets them."""
    argv = request["argv"]
    if argv[0] == "-c":
        sys.argv = ["-c", *argv[2:]]
        sys.path[0] = ""
        return str(argv[1])
    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]  # runpy puts the module's file first
        sys.path[0] = os.getcwd()
        return f"import runpy\nrunpy.run_module({argv[1]!r}, run_name='__main__', alter_sys=True)"
    script = os.path.abspath(argv[0])
    sys.argv = list(argv)
    sys.path[0] = os.path.dirname(script)
    return f"import runpy\nrunpy.run_path({script!r}, run_name='__main__')"


# ---- the client ----

class Zygote:
    """A zygote process, ready once ``path`` exists (started here unless ``start`` is
    false)."""

    def __init__(self, path: Path, modules: Sequence[str], *, watch: int | None = None,
                 log: Path | None = None, env: dict[str, str] | None = None,
                 start: bool = True) -> None:
        self.path = path
        self.env = dict(os.environ if env is None else env)
        self.proc: subprocess.Popen[bytes] | None = None
        self._fixed: dict[str, str] | None = None
        if start:
            self._start(modules, os.getpid() if watch is None else watch,
                        log or path.with_suffix(".log"))

    def _start(self, modules: Sequence[str], watch: int, log: Path) -> None:
        source = Path(__file__).read_text()
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", source, str(self.path), str(watch), *modules],
                env=self.env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True)
        deadline = time.monotonic() + 120
        while not self.path.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the zygote did not start: {log.read_text()[-3000:]}")
            time.sleep(0.02)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(10)

    def python(self) -> list[str]:
        """A command that runs as ``python`` would, in a child of this zygote, for a launcher
        that starts its children itself: ``torchrun --no-python *zygote.python() -u SCRIPT``.
        """
        return [sys.executable, __file__, "exec", str(self.path)]

    def forks(self, args: Sequence[str], env: dict[str, str]) -> bool:
        """Whether a child of this zygote can be ``args`` with ``env`` (else: subprocess)."""
        if not args or args[0] != sys.executable:
            return False
        options = [a for a in args[1:3] if a.startswith("-") and a not in ("-c", "-m")]
        if any(a != "-u" for a in options) or len(args) < 2 + len(options):
            return False
        if self._fixed is None:
            self._fixed = json.loads(self.path.read_text())["fixed"]
        if _fixed(env) == self._fixed:
            return True
        with self.path.with_suffix(".fallbacks").open("a") as log:  # to find out why, if slow
            log.write(f"{args[:2]}: {_fixed(env)} != {self._fixed}\n")
        return False

    def run(self, args: Sequence[str], *, env: dict[str, str] | None = None,
            cwd: str | Path | None = None, stdin: Any = None, stdout: Any = None,
            stderr: Any = None, capture_output: bool = False, text: bool = False,
            timeout: float | None = None, check: bool = False) -> subprocess.CompletedProcess:
        """``subprocess.run(args, ...)`` for ``args = [sys.executable, [-u], -c CODE | -m
        MODULE | SCRIPT, ...]``, in a child of the zygote."""
        env = dict(os.environ if env is None else env)
        if not self.forks(args, env):
            return subprocess.run(args, env=env, cwd=cwd, stdin=stdin, stdout=stdout,
                                  stderr=stderr, capture_output=capture_output, text=text,
                                  timeout=timeout, check=check)
        if capture_output:
            stdout = stderr = subprocess.PIPE
        unbuffered = args[1] == "-u"
        argv = list(args[2:] if unbuffered else args[1:])
        child = _Child(self.path, {"argv": argv, "env": env, "cwd": os.fspath(cwd or
                                                                        os.getcwd()),
                                   "unbuffered": unbuffered}, stdin, stdout, stderr)
        returncode = child.wait(timeout)
        out, err = child.output(text)
        if returncode is None:
            raise subprocess.TimeoutExpired(list(args), timeout or 0, out, err)
        done = subprocess.CompletedProcess(list(args), returncode, out, err)
        if check:
            done.check_returncode()
        return done


class _Child:
    """One request: its pipes, its pid, its exit code."""

    def __init__(self, path: Path, request: dict[str, Any], stdin: Any, stdout: Any,
                 stderr: Any) -> None:
        self.readers: dict[int, threading.Thread] = {}
        self.chunks: dict[int, list[bytes]] = {}
        theirs: list[int] = []
        close: list[int] = []
        for target, how in enumerate((stdin, stdout, stderr)):
            if how is None:
                theirs.append(target)
            elif how == subprocess.DEVNULL:
                fd = os.open(os.devnull, os.O_RDWR)
                theirs.append(fd)
                close.append(fd)
            elif how == subprocess.STDOUT and target == 2:
                theirs.append(theirs[1])
            elif how == subprocess.PIPE and target > 0:
                read, write = os.pipe()
                theirs.append(write)
                close.append(write)
                self._collect(target, read)
            elif isinstance(how, int) and how >= 0:
                theirs.append(how)
            elif hasattr(how, "fileno"):
                theirs.append(how.fileno())
            else:
                raise ValueError(f"zygote: unsupported stream {how!r}")
        body = json.dumps(request).encode()
        self.conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.conn.connect(_address(str(path)))
        socket.send_fds(self.conn, [struct.pack("!I", len(body))], theirs)
        self.conn.sendall(body)
        for fd in close:
            os.close(fd)
        self.replies = self.conn.makefile("rb")
        line = self.replies.readline()
        if not line:
            raise RuntimeError(f"zygote at {path}: no answer (see its log)")
        self.pid = int(line)

    def _collect(self, target: int, fd: int) -> None:
        chunks: list[bytes] = []

        def read() -> None:
            with open(fd, "rb", buffering=0) as pipe:
                while chunk := pipe.read(65536):
                    chunks.append(chunk)

        self.chunks[target] = chunks
        self.readers[target] = threading.Thread(target=read, daemon=True)
        self.readers[target].start()

    def wait(self, timeout: float | None) -> int | None:
        """The exit code, or None after killing the child's session at ``timeout``."""
        ready, _, _ = select.select([self.conn], [], [], timeout)
        if not ready:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGKILL)
            self.replies.readline()
            self.conn.close()
            return None
        line = self.replies.readline()
        self.conn.close()
        return int(line)

    def output(self, text: bool) -> tuple[Any, Any]:
        got: list[Any] = []
        for target in (1, 2):
            if target not in self.readers:
                got.append(None)
                continue
            self.readers[target].join(30)
            data = b"".join(self.chunks[target])
            got.append(data.decode(errors="replace") if text else data)
        return got[0], got[1]


def shared(base: Path, modules: Sequence[str] = HEAVY) -> Zygote:
    """The zygote of this pytest run, started by the first worker that asks (pytest-xdist
    workers share ``base``, the parent of their ``tmp_path_factory.getbasetemp()``)."""
    path = base / "zygote.ready"
    watch = os.getppid() if os.environ.get("PYTEST_XDIST_WORKER") else os.getpid()
    with open(base / "zygote.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return Zygote(path, modules, watch=watch, start=not path.exists())


def _exec(ready: str, args: list[str]) -> None:
    """``python zygote.py exec READY [-u] ARGS...``: this process as ``python [-u] ARGS...``
    run by the zygote whose ready file is READY, for a launcher that starts its children
    itself (``torchrun --no-python``): the child gets this process's environment, directory
    and standard streams; the signals a launcher sends go to the child's process group; this
    process ends as the child ended (the same exit code or signal); if it is killed, so is
    the child."""
    request = {"argv": args[1:] if args[0] == "-u" else args, "env": dict(os.environ),
               "cwd": os.getcwd(), "unbuffered": args[0] == "-u"}
    child = _Child(Path(ready), request, None, None, None)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, lambda sig, _: os.killpg(child.pid, sig))
    code = child.wait(None)
    assert code is not None
    if code < 0:
        if -code not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    sys.exit(code)


if __name__ == "__main__" and sys.argv[1:2] == ["exec"]:
    _exec(sys.argv[2], sys.argv[3:])
elif __name__ == "__main__":
    for _name in sys.argv[3:]:
        __import__(_name)
    import gc
    gc.freeze()
    _request, _fds = _serve(sys.argv[1], int(sys.argv[2]))
    _namespace = _become(_request, _fds)
    exec(compile(_main_code(_request), "<string>", "exec"), _namespace)
