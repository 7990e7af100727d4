"""A template process for README python blocks: imports heavy third-party modules once, then
forks one child per block that runs the block as ``python -c TEXT`` would (tests/test_readme.py).

Run as ``python -c "$(cat readme_template.py)" REQUEST_FD REPLY_FD MODULE...``, so that its
``sys.path[0]`` is ``''`` as in ``python -c``. It imports the MODULEs (third-party ones only:
wds_cloud is imported afresh by each block, as the README's imports say), then serves requests
on REQUEST_FD, one at a time: a length-prefixed JSON object ``{"text", "env", "cwd", "log"}``.
For each it forks a child, writes the child's pid to REPLY_FD, waits for it and writes its exit
code (as ``subprocess`` gives it: negative for a signal). The child starts a new session,
takes the block's environment exactly, its directory, stdout and stderr to the log and stdin
from /dev/null, and runs the text in a fresh ``__main__`` module at the top level of this
script, so that exceptions, ``SystemExit``, atexit handlers and the joining of threads at the
end are the interpreter's own, as in ``python -c``.

The template is single-threaded whenever it forks: it starts no threads, and OpenBLAS (loaded
with numpy) stops the thread pool it starts at import before any fork (a warm-up fork below
does it once; each request checks that the template is still one thread).
"""

import importlib
import json
import os
import struct
import sys


def _read_exactly(fd: int, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = os.read(fd, size - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _serve(request_fd: int, reply_fd: int) -> dict:
    """Returns, in a forked child only, the request it is to run."""
    pid = os.fork()  # warm-up: atfork handlers (OpenBLAS's) stop their threads
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    while True:
        try:
            (size,) = struct.unpack("!I", _read_exactly(request_fd, 4))
        except EOFError:
            os._exit(0)
        request = json.loads(_read_exactly(request_fd, size))
        if _threads() != 1:
            raise RuntimeError(f"the template runs {_threads()} threads: it cannot fork cleanly")
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            os.close(request_fd)
            os.close(reply_fd)
            return request
        os.write(reply_fd, f"{pid}\n".encode())
        _, status = os.waitpid(pid, 0)
        os.write(reply_fd, f"{os.waitstatus_to_exitcode(status)}\n".encode())


def _become(request: dict) -> dict:
    """This child as the block's ``python -c`` process; returns its fresh ``__main__``."""
    import types

    os.setsid()
    null = os.open(os.devnull, os.O_RDONLY)
    log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(null)
    os.close(log)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    if "multiprocessing.process" in sys.modules:  # where spawned children start
        sys.modules["multiprocessing.process"].ORIGINAL_DIR = os.getcwd()
    if "numpy" in sys.modules:  # a fresh process seeds numpy's global generator anew
        sys.modules["numpy"].random.seed()
    sys.argv = ["-c"]
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = __builtins__
    sys.modules["__main__"] = main
    return main.__dict__


if __name__ == "__main__":
    for _name in sys.argv[3:]:
        importlib.import_module(_name)
    _request = _serve(int(sys.argv[1]), int(sys.argv[2]))
    _namespace = _become(_request)
    exec(compile(_request["text"], "<string>", "exec"), _namespace)
