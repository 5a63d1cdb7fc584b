"""The suite's short Python commands (``manage.py`` as an admin types it,
``python -c``), forked from a process that has already imported the
libraries every one of them imports.

A deployment test types manage.py commands as an admin would, dozens of
times a file (a token, register, approve, a sweep planned, a maintenance
switched), and each started Python and imported Django, Celery, numpy,
redis and the rest again: 1.5-1.8 s of CPU a command on this 2-core
machine, a fifth of what the end-to-end files used. The server here
imports, once per test process, only libraries that read neither Django's
settings nor the project (no ``matrix`` or ``runners`` code, nothing that
reads the environment at import beyond debugging switches), then forks a
child per command. The child takes the command's environment, working
directory and output files, runs the command as its ``__main__`` and exits
as Python exits (exit hooks, threads joined), so what the command reads,
does and says is its own: the project's code and settings are imported
fresh in every command.

``run()`` answers as ``subprocess.run(..., capture_output=True, text=True)``
does. Commands started any other way (long-lived processes, a prefix such
as ``ip netns exec``, another interpreter) stay plain subprocesses.
"""

from __future__ import annotations

import atexit
import gc
import importlib
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import types
from pathlib import Path

# Imported by every manage.py command, and harmless to import before the
# command's environment is known: no settings read, no project code.
# (django-ninja reads Django's settings as it is imported: not here.)
PRELOAD = (
    "django.core.management",
    "django.db.models",
    "django.urls",
    "django.http",
    "django.test",
    "django.forms",
    "django.template",
    "pydantic",
    "numpy",
    "redis",
    "celery",
    "celery.app",
    "kombu",
    "amqp",
    "yaml",
    "jinja2",
    "celery_batches",
    "click",
    "sqlparse",
    "psycopg",
    "nacl.signing",
    "environ",
    "billiard",
    "pydantic_core",
    "annotated_types",
    "asyncio",
    "ssl",
    "uuid",
    "inspect",
    "subprocess",
    "platform",
    "zoneinfo",
    "concurrent.futures",
    "logging.config",
    "urllib.request",
    "http.client",
    "email.message",
    "decimal",
    "zipfile",
)


# The server ----------------------------------------------------------------


def serve(path: str) -> dict:
    """Import PRELOAD, then answer requests on the socket at ``path`` until
    the test process closes this one's stdin. Returns only in a forked
    child, with the request it is to run."""
    for name in PRELOAD:
        importlib.import_module(name)
    # What was imported stays shared with the children: the collector
    # would otherwise touch (and so copy) every page of it in each.
    gc.collect()
    gc.freeze()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    woken, wake = os.pipe()
    os.set_blocking(woken, False)
    os.set_blocking(wake, False)
    signal.set_wakeup_fd(wake)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "accept")
    selector.register(woken, selectors.EVENT_READ, "reap")
    selector.register(0, selectors.EVENT_READ, "parent")
    waiting: dict[int, socket.socket] = {}
    while True:
        for key, _ in selector.select():
            if key.data == "parent" and not os.read(0, 4096):
                for pid in waiting:
                    os.kill(pid, signal.SIGKILL)
                os._exit(0)
            if key.data == "reap":
                try:
                    while os.read(woken, 4096):
                        pass
                except BlockingIOError:
                    pass
            if key.data == "accept":
                conn, _ = listener.accept()
                request = json.loads(conn.makefile("rb").readline())
                pid = os.fork()
                if pid == 0:
                    signal.set_wakeup_fd(-1)
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    selector.close()
                    for held in (listener, conn, *waiting.values()):
                        held.close()
                    os.close(woken)
                    os.close(wake)
                    return request
                conn.sendall(f"{pid}\n".encode())
                waiting[pid] = conn
        _reap(waiting)


def _reap(waiting: dict[int, socket.socket]) -> None:
    while waiting:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = waiting.pop(pid, None)
        if conn is not None:
            try:
                conn.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
            except OSError:
                pass  # the client gave up on it
            conn.close()


def start_command(request: dict) -> None:
    """In the forked child: become the command's process and run it as
    ``python ARGV`` would; returns only if the command returns."""
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    for fd, name in ((1, "stdout"), (2, "stderr")):
        out = os.open(request[name], os.O_WRONLY | os.O_TRUNC)
        os.dup2(out, fd)
        os.close(out)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    if os.environ.get("PYTHONUNBUFFERED"):
        sys.stdout.reconfigure(write_through=True)
        sys.stderr.reconfigure(write_through=True)
    argv = request["argv"]
    if argv[0] == "-c":
        sys.argv = ["-c", *argv[2:]]
        sys.path[0] = ""
        main = types.ModuleType("__main__")
        sys.modules["__main__"] = main
        exec(compile(argv[1], "<string>", "exec"), main.__dict__)
    else:
        import runpy

        sys.argv = list(argv)
        sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
        runpy.run_path(argv[0], run_name="__main__")


# The client ------------------------------------------------------------------

_lock = threading.Lock()
_server: dict = {}


def _address() -> str:
    """The socket of this test process's server, started the first time."""
    with _lock:
        if _server.get("pid") != os.getpid():
            folder = tempfile.mkdtemp(prefix="tm-forks-")
            path = os.path.join(folder, "socket")
            proc = subprocess.Popen(
                [sys.executable, __file__, path],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                cwd=folder,
                env={k: v for k, v in os.environ.items() if not k.startswith("DJANGO")},
            )
            _server.update(pid=os.getpid(), proc=proc, path=path, folder=folder)
            atexit.register(_stop, proc, folder)
        return _server["path"]


def _stop(proc: subprocess.Popen, folder: str) -> None:
    proc.stdin.close()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
    import shutil

    shutil.rmtree(folder, ignore_errors=True)


def _connect(path: str) -> socket.socket:
    import time

    deadline = time.monotonic() + 60
    while True:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(path)
            return conn
        except (FileNotFoundError, ConnectionRefusedError):
            conn.close()
            if time.monotonic() > deadline or _server["proc"].poll() is not None:
                raise RuntimeError("the suite's fork server did not start") from None
            time.sleep(0.02)


def _line(conn: socket.socket) -> bytes:
    """One answer of the server: a number and a newline."""
    said = b""
    while not said.endswith(b"\n"):
        chunk = conn.recv(64)
        if not chunk:
            raise RuntimeError("the suite's fork server hung up")
        said += chunk
    return said


def run(
    argv: list[str],
    *,
    cwd: str | Path,
    env: dict[str, str],
    timeout: float | None = None,
    check: bool = False,
) -> subprocess.CompletedProcess:
    """``subprocess.run([python, *argv], cwd=, env=, capture_output=True,
    text=True, timeout=, check=)``, forked from the server."""
    with tempfile.TemporaryDirectory(prefix="tm-fork-") as folder:
        outs = {name: os.path.join(folder, name) for name in ("stdout", "stderr")}
        for path in outs.values():
            Path(path).touch()
        conn = _connect(_address())
        with conn:
            request = {"argv": argv, "cwd": str(cwd), "env": dict(env), **outs}
            conn.sendall(json.dumps(request).encode() + b"\n")
            pid = int(_line(conn))
            conn.settimeout(timeout)
            try:
                code = int(_line(conn))
            except TimeoutError:
                os.kill(pid, signal.SIGKILL)
                raise subprocess.TimeoutExpired(
                    [sys.executable, *argv],
                    timeout,
                    output=Path(outs["stdout"]).read_text(errors="replace"),
                    stderr=Path(outs["stderr"]).read_text(errors="replace"),
                ) from None
        done = subprocess.CompletedProcess(
            [sys.executable, *argv],
            code,
            Path(outs["stdout"]).read_text(errors="replace"),
            Path(outs["stderr"]).read_text(errors="replace"),
        )
    if check:
        done.check_returncode()
    return done


if __name__ == "__main__":
    start_command(serve(sys.argv[1]))
