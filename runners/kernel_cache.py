"""The runner's kernel cache, kept under a size limit.

Each toolchain's TileLang cache lives in ``KEY_DIR/kernel-cache/<toolchain>``
(``runners.host``). TileLang never removes a kernel it built, so nvcc builds
filled a small runner disk, and every job after that failed for want of
space. Here the least recently used entries go first, until the whole cache
(every toolchain's) is within TILEMATRIX_RUNNER_KERNEL_CACHE_MB.

An entry is one directory TileLang keeps (0.1.13 and 0.1.15 alike): a
compiled kernel, ``<version>/<platform>/kernels/<key>``, or what a build
left behind in ``.staging`` or ``tmp``. A kernel's last use is the newest
time on it: the harness stamps a kernel's directory when it uses it
(``runners.harness.stages``), since loading one from the cache changes no
time the filesystem keeps (relatime). Files beside the entries (the device
lock, the compiler probe) are neither counted nor removed.
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from runners import config as agent_config

log = logging.getLogger(__name__)

KERNELS = "kernels"
LEFTOVERS = (".staging", "tmp")
# A kernel used this recently may be being loaded by a job right now.
IN_USE_S = 60.0
# TileLang's own age for a staging directory a crashed build left behind:
# younger, a build may still be writing it.
BUILDING_S = 3600.0


@dataclass(frozen=True)
class Entry:
    path: Path
    size: int
    used: float
    protected: bool


@dataclass(frozen=True)
class Trimmed:
    before: int  # bytes in the cache's entries before
    removed: int  # entries removed
    freed: int  # their bytes

    @property
    def after(self) -> int:
        return self.before - self.freed


def _measure(path: Path) -> tuple[int, float]:
    """Bytes on disk under ``path``, and the newest time on it."""
    size, newest = 0, 0.0
    stack = [path]
    while stack:
        current = stack.pop()
        try:
            info = current.lstat()
        except FileNotFoundError:
            continue
        size += info.st_blocks * 512
        is_dir = stat.S_ISDIR(info.st_mode)
        # A directory's access time moves when it is listed, by this walk
        # too: only a file's says it was read (loaded).
        newest = max(newest, info.st_mtime, 0.0 if is_dir else info.st_atime)
        if is_dir:
            try:
                stack.extend(current.iterdir())
            except (FileNotFoundError, NotADirectoryError):
                continue
    return size, newest


def entries(root: Path, *, now: float | None = None) -> list[Entry]:
    """Every entry under ``root``, each toolchain's cache alike."""
    now = time.time() if now is None else now
    found = []
    for dirpath, dirnames, _ in os.walk(root):
        name = os.path.basename(dirpath)
        if name == KERNELS or name in LEFTOVERS:
            grace = IN_USE_S if name == KERNELS else BUILDING_S
            for child in dirnames:
                size, used = _measure(Path(dirpath, child))
                found.append(
                    Entry(Path(dirpath, child), size, used, now - used < grace)
                )
            for child in os.listdir(dirpath) if name in LEFTOVERS else ():
                path = Path(dirpath, child)
                if child not in dirnames and path.is_file():
                    size, used = _measure(path)
                    found.append(Entry(path, size, used, now - used < grace))
            dirnames.clear()  # an entry's insides are the entry's
    return found


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def cache_trim(root: Path, limit_bytes: int, *, now: float | None = None) -> Trimmed:
    """Remove the least recently used entries under ``root`` until they
    hold at most ``limit_bytes``. Entries in use (a kernel used within
    IN_USE_S, a build younger than BUILDING_S) stay, even over the limit.
    Several processes may trim one cache at once: each removes what it
    finds, and an entry already gone is skipped."""
    found = entries(root, now=now)
    before = sum(e.size for e in found)
    total, removed, freed = before, 0, 0
    for entry in sorted(found, key=lambda e: e.used):
        if total <= limit_bytes:
            break
        if entry.protected:
            continue
        _remove(entry.path)
        total -= entry.size
        removed += 1
        freed += entry.size
    if total > limit_bytes:
        log.warning(
            "kernel cache %s holds %d MB in entries in use, over its %d MB limit",
            root,
            total // 2**20,
            limit_bytes // 2**20,
        )
    return Trimmed(before=before, removed=removed, freed=freed)


# A process trims the cache before a batch at most this often: the walk
# costs milliseconds a thousand entries, and a batch adds a few.
TRIM_EVERY_S = 30.0
_last_trim = [float("-inf")]


def cache_keep(root: Path, *, urgent: bool = False) -> Trimmed | None:
    """Keep the kernel cache under ``root`` within
    TILEMATRIX_RUNNER_KERNEL_CACHE_MB; ``urgent`` (a write found the disk
    full) halves it besides, least recently used first, and is never put
    off. None when put off."""
    now = time.monotonic()
    if not urgent and now - _last_trim[0] < TRIM_EVERY_S:
        return None
    _last_trim[0] = now
    limit = agent_config.kernel_cache_limit_bytes()
    if urgent:
        limit = min(limit, sum(e.size for e in entries(root)) // 2)
    trimmed = cache_trim(root, limit)
    if trimmed.removed:
        log.info(
            "kernel cache: removed %d least recently used entries (%.1f MB), "
            "%.1f MB kept",
            trimmed.removed,
            trimmed.freed / 2**20,
            trimmed.after / 2**20,
        )
    return trimmed
