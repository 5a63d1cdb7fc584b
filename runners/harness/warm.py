"""Library children kept warm between batches.

A child's start (the sandbox, Python, torch and TileLang imported, a device
context) takes two to five seconds, more than a cached kernel's whole job:
a runner that started a child per message spent most of a small message
starting it. Where the caller asks for it (``run_child(keep_warm=True)``,
which a runner's worker does), a trusted library child that finished its
jobs well waits, idle, for the next batch of the same toolchain, kernel
cache, targets and environment, and takes it on its stdin.

A kept child is ended once it is older than MAX_AGE_S or idle longer than
IDLE_S, and when this process exits; it also ends itself when its stdin
closes (its supervisor is gone). Only trusted library children are kept:
their code is the operator library, and a child that failed a job (or
whose kernel crashed) is never kept.
"""

from __future__ import annotations

import atexit
import queue
import threading
import time
from concurrent.futures import Future

MAX_AGE_S = 1800.0
IDLE_S = 300.0
REAP_EVERY_S = 30.0
# At most this many idle children per key: a batch uses at most the
# compile workers' count (16) at once.
KEPT_PER_KEY = 16

_lock = threading.Lock()
_idle: dict[tuple, list[tuple[float, object]]] = {}


_keeper_jobs: queue.SimpleQueue = queue.SimpleQueue()
_keeper: threading.Thread | None = None


def start_in_keeper(start):
    """``start()`` (which starts a child process) run in one long-lived
    thread: bwrap's --die-with-parent kills a child when the thread that
    started it ends, and a batch's threads end with the batch."""
    global _keeper
    with _lock:
        if _keeper is None or not _keeper.is_alive():
            _keeper = threading.Thread(target=_keep, name="warm-children", daemon=True)
            _keeper.start()
    done: Future = Future()
    _keeper_jobs.put((start, done))
    return done.result()


def _keep() -> None:
    """The keeper's loop: start children when asked, and end those idle
    too long meanwhile, so an idle worker does not hold their memory."""
    while True:
        try:
            start, done = _keeper_jobs.get(timeout=REAP_EVERY_S)
        except queue.Empty:
            with _lock:
                ended = _stale_locked(time.perf_counter())
            for spawned in ended:
                spawned.end()
            continue
        try:
            done.set_result(start())
        except BaseException as exc:  # handed to the caller
            done.set_exception(exc)


def take(key: tuple):
    """An idle child for ``key``, or None; ends those too old to keep."""
    ended = []
    found = None
    now = time.perf_counter()
    with _lock:
        kept = _idle.get(key, [])
        while kept and found is None:
            since, spawned = kept.pop()
            if _fresh(spawned, since, now):
                found = spawned
            else:
                ended.append(spawned)
        ended += _stale_locked(now)
    for spawned in ended:
        spawned.end()
    return found


def put(key: tuple, spawned) -> bool:
    """Keep ``spawned`` idle for the next batch of ``key``; False (the
    caller ends it) when it is too old or enough are kept."""
    now = time.perf_counter()
    if now - spawned.born > MAX_AGE_S:
        return False
    with _lock:
        kept = _idle.setdefault(key, [])
        if len(kept) >= KEPT_PER_KEY:
            return False
        kept.append((now, spawned))
    return True


def end_all() -> None:
    """End every idle child (at exit, and between tests that change what a
    child would be started with)."""
    with _lock:
        ended = [spawned for kept in _idle.values() for _, spawned in kept]
        _idle.clear()
    for spawned in ended:
        spawned.end()


def idle_count() -> int:
    with _lock:
        return sum(len(kept) for kept in _idle.values())


def _fresh(spawned, since: float, now: float) -> bool:
    return (
        now - since <= IDLE_S
        and now - spawned.born <= MAX_AGE_S
        and spawned.child.proc.poll() is None
    )


def _stale_locked(now: float) -> list:
    ended = []
    for key, kept in list(_idle.items()):
        keep = [(since, s) for since, s in kept if _fresh(s, since, now)]
        ended += [s for since, s in kept if not _fresh(s, since, now)]
        if keep:
            _idle[key] = keep
        else:
            del _idle[key]
    return ended


atexit.register(end_all)
