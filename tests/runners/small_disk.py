"""A real small filesystem for the tests of a runner short of disk: a tmpfs
of a few MB mounted on a folder (root, or CAP_SYS_ADMIN, as in CI and on
this machine; skipped elsewhere), and a filler file that takes its space
until the test gives it back."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from pathlib import Path

import pytest


@contextlib.contextmanager
def small_disk(path: Path, megabytes: int):
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={megabytes}m,mode=0711", "tmpfs", path],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", path], check=False)


def fill(path: Path, *, leave_bytes: int = 0) -> Path:
    """Take the free space of ``path``'s filesystem, up to ``leave_bytes``,
    with one file; deleting it gives the space back."""
    filler = path / "filler"
    chunk = b"\0" * 65536
    with filler.open("wb", buffering=0) as out:
        while (free := free_bytes(path)) > leave_bytes:
            try:
                out.write(chunk[: max(4096, min(len(chunk), free - leave_bytes))])
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
                break
    return filler


def free_bytes(path: Path) -> int:
    stat = os.statvfs(path)
    return stat.f_bavail * stat.f_frsize
