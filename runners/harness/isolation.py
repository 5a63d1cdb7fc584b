"""Who a harness child runs as, and what network it sees.

When the supervisor runs as root, each child gets a uid and gid of its own
from ``UID_RANGE`` (no passwd entry, no supplementary groups) and a fresh
network namespace whose only interface is a loopback that is down: the child
cannot read files only the runner's user may read (its signing key), reach
the database, the broker or anything else, or signal another child. Both
come from util-linux ``unshare --net --setuid --setgid``, which drops the
supplementary groups too. A uid of its own also makes RLIMIT_NPROC count the
child's processes only, and lets the supervisor kill every process the child
left behind, even ones that left its process group.

The child also gets a mount namespace of its own. When the interpreter lives
under a directory other users cannot enter (a pyenv build under /root), that
directory is covered by an empty tmpfs inside the namespace and only the
interpreter's subtree is bound back, so the child can start Python without
seeing anything else there.

Without root (a developer's laptop) the child runs as the supervisor's user
with the network the host gives; ``Identity.isolated`` says which.
"""

from __future__ import annotations

import fcntl
import os
import re
import shlex
import shutil
import signal
import tempfile
from dataclasses import dataclass
from pathlib import Path

UID_RANGE = range(61000, 61512)
# Trusted library children of every supervisor share one uid, which owns the
# per-toolchain kernel caches they share.
LIBRARY_UID = 61999
_LOCK_DIR = Path(tempfile.gettempdir(), "tm-sandbox-uids")
_MOUNTS = Path("/run/tm-sandbox")
# A mount point that only exists for the bind-back below (root only).
_STASH = _MOUNTS / "stash"
# Where a shared kernel cache appears inside the child's mount namespace:
# the cache may live under a directory the child's uid cannot enter (the
# runner's own directory, next to its key).
CACHE_POINT = _MOUNTS / "kernel-cache"
_KILL_ROUNDS = 100
_UID_LINE = re.compile(r"^Uid:\s+(\d+)", re.MULTILINE)


@dataclass
class Identity:
    uid: int | None
    lock_fd: int | None = None
    exclusive: bool = True

    @property
    def isolated(self) -> bool:
        return self.uid is not None

    def cache_path(self, cache: str) -> str:
        """Where the child sees the shared kernel cache ``cache``."""
        return cache if self.uid is None else str(CACHE_POINT)

    def command(self, argv: list[str], *, cache: str | None = None) -> list[str]:
        """``argv`` wrapped to start in fresh network and mount namespaces
        as the child's uid, with every capability dropped; ``cache`` is bound
        at ``CACHE_POINT``."""
        if self.uid is None:
            return argv
        _MOUNTS.mkdir(mode=0o755, exist_ok=True)
        lines = []
        if cache is not None:
            CACHE_POINT.mkdir(mode=0o755, exist_ok=True)
            lines.append(f"mount --bind {shlex.quote(cache)} {CACHE_POINT}")
        hidden = closed_ancestor(argv[0])
        if hidden is not None:
            closed, exposed = (shlex.quote(p) for p in hidden)
            _STASH.mkdir(mode=0o700, exist_ok=True)
            stash = shlex.quote(str(_STASH))
            lines += [
                f"mount --rbind {exposed} {stash}",
                f"mount -t tmpfs -o mode=0755,size=64k tmpfs {closed}",
                f"mkdir -p {exposed}",
                f"mount --rbind {stash} {exposed}",
            ]
        uid = self.uid
        lines.append(
            f"exec setpriv --reuid={uid} --regid={uid} --clear-groups "
            '--inh-caps=-all -- "$@"'
        )
        script = "\n".join(lines)
        return [
            "unshare",
            "--net",
            "--mount",
            "--propagation",
            "private",
            "--",
            "sh",
            "-ec",
            script,
            "tm-sandbox",
            *argv,
        ]

    def give(self, *paths: str) -> None:
        """Hand ``paths`` (and what is under them) to the child's uid."""
        if self.uid is None:
            return
        for top in paths:
            for root, dirs, files in os.walk(top):
                os.chown(root, self.uid, self.uid)
                for name in dirs + files:
                    os.chown(
                        os.path.join(root, name),
                        self.uid,
                        self.uid,
                        follow_symlinks=False,
                    )

    def kill_all(self) -> None:
        """SIGKILL every process of the child's uid until none is left: a
        fork bomb that left the process group cannot outlive its job."""
        if self.uid is None or not self.exclusive:
            return
        for _ in range(_KILL_ROUNDS):
            pids = processes_of(self.uid)
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def release(self) -> None:
        if self.lock_fd is not None:
            os.close(self.lock_fd)
            self.lock_fd = None


def can_isolate() -> bool:
    return os.geteuid() == 0 and all(
        shutil.which(tool) for tool in ("unshare", "setpriv")
    )


def closed_ancestor(executable: str) -> tuple[str, str] | None:
    """(D, D/NEXT) for the first directory D on the real path of
    ``executable`` that other users may not enter, or None."""
    path = Path(os.path.realpath(shutil.which(executable) or executable))
    parts = path.parts
    for depth in range(1, len(parts) - 1):
        directory = Path(*parts[:depth])
        if not os.stat(directory).st_mode & 0o001:
            return str(directory), str(Path(*parts[: depth + 1]))
    return None


def library() -> Identity:
    """The shared identity of trusted library children."""
    if not can_isolate():
        return Identity(uid=None)
    return Identity(uid=LIBRARY_UID, exclusive=False)


def acquire() -> Identity:
    """A uid no other live child (of any supervisor on this host) holds, or
    the supervisor's own identity where it cannot switch users."""
    if not can_isolate():
        return Identity(uid=None)
    _LOCK_DIR.mkdir(mode=0o700, exist_ok=True)
    for uid in UID_RANGE:
        fd = os.open(_LOCK_DIR / str(uid), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        identity = Identity(uid=uid, lock_fd=fd)
        # A previous holder may have died before cleaning up.
        identity.kill_all()
        return identity
    raise RuntimeError(f"all {len(UID_RANGE)} sandbox uids are in use")


def processes_of(uid: int) -> list[int]:
    pids = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        # The real uid from status: /proc/PID itself is owned by root while
        # a process is not dumpable.
        try:
            status = Path(entry.path, "status").read_text()
        except OSError:
            continue
        match = _UID_LINE.search(status)
        # A zombie runs nothing; it waits for a parent that may never reap it.
        if match and int(match.group(1)) == uid and "\nState:\tZ" not in status:
            pids.append(int(entry.name))
    return pids
