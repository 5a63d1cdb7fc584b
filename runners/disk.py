"""A runner host short of disk: how to tell, from an error or from the free
space left, so that a full disk ends as the runner's trouble (infra_error,
its message given back to the queue) and never as a kernel's verdict."""

from __future__ import annotations

import errno
import re
import shutil
from collections.abc import Iterable
from pathlib import Path

DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
# What the OS says (strerror), as a compiler or Python quotes it in a
# failed build's message.
_DISK_FULL_TEXT = re.compile(r"No space left on device|Disk quota exceeded")
# The words every result and log line about it starts with.
SHORT_OF_DISK = "the runner is short of disk"


def is_disk_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in DISK_FULL_ERRNOS


def says_disk_full(result: dict) -> bool:
    """Whether a job's result failed because a write found the disk full
    (a build's output, a temporary file), whatever status the harness gave."""
    error = result.get("error") or {}
    return bool(_DISK_FULL_TEXT.search(str(error.get("message") or "")))


def disk_short(paths: Iterable[Path], min_free_bytes: int) -> str | None:
    """Why a runner should take no job now: the filesystem of one of
    ``paths`` has less than ``min_free_bytes`` free. None when all have."""
    for path in paths:
        try:
            free = shutil.disk_usage(path).free
        except OSError:
            continue  # not there yet: whoever needs it makes it
        if free < min_free_bytes:
            return (
                f"{SHORT_OF_DISK}: {free / 2**20:.1f} MB free on {path}, under "
                f"TILEMATRIX_RUNNER_DISK_FREE_MB ({min_free_bytes / 2**20:.0f} MB)"
            )
    return None
