"""Where a harness child runs: bubblewrap namespaces, a uid of its own, and
only the files it needs.

Every child starts through ``bwrap`` (Debian's bubblewrap) in new mount,
PID, IPC, UTS, cgroup and network namespaces. Its root is an empty tmpfs
holding read-only binds of exactly what it needs (``Mounts``): /usr and the
merged-/usr links, the loader's cache, the toolchain's interpreter and its
packages, the harness code; its own writable directory; a private /tmp and
/dev/shm; the CUDA or ROCm toolkit for a GPU target, and the GPU's device
nodes and driver libraries where the host has them. Nothing else of the host
exists there: no /var/run and its Unix sockets, no /root, no repository
var/ (database, keys), no other process (its /proc shows its own PID
namespace only), no network but a loopback of its own where nothing
listens, and so no abstract Unix socket of the host either (those belong to
a network namespace).

When the supervisor runs as root, the child also drops to a uid of its own
from ``UID_RANGE`` through setpriv (no supplementary groups, no
capabilities, no new privileges): RLIMIT_NPROC then counts its processes
only, and every process of that uid is killed when its job ends.

``confinement()`` says which of the two this host gives. Submitted kernels
run only where both do (``FULL``); library kernels run anywhere, and the
result and the log say what is missing.
"""

from __future__ import annotations

import fcntl
import functools
import glob
import json
import logging
import os
import re
import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

UID_RANGE = range(61000, 61512)
# Trusted library children of every supervisor share one uid, which owns the
# per-toolchain kernel caches they share.
LIBRARY_UID = 61999
# One place per host, whatever a supervisor's TMPDIR (or systemd's
# PrivateTmp) says: two supervisors locking in different folders took the
# same uid and SIGKILLed each other's children, blaming the kernel. Only a
# root supervisor takes uids, and /run is the host's own.
_LOCK_DIR = Path("/run/tilematrix-sandbox-uids")
# Where a shared kernel cache appears inside the sandbox: the cache may live
# under a directory the child must not see (the runner's own, next to its key).
CACHE_POINT = "/run/tm-sandbox/kernel-cache"
HOSTNAME = "tm-sandbox"
TMP_BYTES = 512 * 2**20
SHM_BYTES = 64 * 2**20
_KILL_ROUNDS = 100
_UID_LINE = re.compile(r"^Uid:\s+(\d+)", re.MULTILINE)

FULL, NAMESPACES, NONE = "full", "namespaces", "none"
NO_BWRAP = (
    "no working bubblewrap (bwrap): the child shares the host's files, "
    "processes, Unix sockets and network"
)
NO_ROOT = "not root: the child runs as the runner's own user, not a uid of its own"

# Whole trees a child never gets, even when a toolchain path names one.
_NEVER_BOUND = ("/", "/root", "/home", "/var", "/run", "/tmp", "/etc", "/dev")
# The loader's configuration and the compiler's alternatives (cc -> gcc).
_SYSTEM_FILES = (
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/alternatives",
)
# What every sandbox has before the binds (mounted or linked above them).
_SANDBOX_TREES = ("/usr", "/proc", "/dev", "/bin", "/sbin", "/lib", "/lib64")
_MERGED_USR = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# The toolkits a target compiles with, by environment variable and default.
_TOOLKITS = {
    "cuda": (("CUDA_HOME", "CUDA_PATH"), "/usr/local/cuda"),
    "hip": (("ROCM_PATH", "ROCM_HOME", "HIP_PATH"), "/opt/rocm"),
}
_DEVICE_NODES = {
    "cuda": ("/dev/nvidia*", "/dev/nvidia-caps"),
    "hip": ("/dev/kfd", "/dev/dri"),
}
_DRIVER_LIBRARIES = {
    "cuda": re.compile(r"^lib(cuda|nvidia-[\w-]+)\.so"),
    "hip": re.compile(r"^lib(hsa-runtime64|amdhip64|drm_amdgpu)\.so"),
}


@dataclass(frozen=True)
class Confinement:
    """What this host's sandbox gives a child: ``level`` is FULL (namespaces
    and a uid of its own), NAMESPACES (no root) or NONE (no bwrap)."""

    level: str
    missing: tuple[str, ...] = ()

    def describe(self) -> str:
        if self.level == FULL:
            return "full: bwrap namespaces and a uid of its own"
        return f"{self.level}: " + "; ".join(self.missing)


@dataclass(frozen=True)
class Mounts:
    """What one child sees besides the system (``system_mounts``): host
    paths bound at the same path, read-only or writable; ``aliases``
    (host path, path inside) bound writable elsewhere; device nodes."""

    read_only: tuple[str, ...] = ()
    writable: tuple[str, ...] = ()
    aliases: tuple[tuple[str, str], ...] = ()
    devices: tuple[str, ...] = ()
    workdir: str = "/"


NO_MOUNTS = Mounts()


@dataclass
class Identity:
    uid: int | None
    lock_fd: int | None = None
    exclusive: bool = True
    confinement: Confinement = Confinement(NONE, (NO_BWRAP, NO_ROOT))

    def cache_path(self, cache: str) -> str:
        """Where the child sees the shared kernel cache ``cache``."""
        return cache if self.confinement.level == NONE else CACHE_POINT

    def command(self, argv: list[str], mounts: Mounts) -> list[str]:
        """``argv`` wrapped to start in the sandbox this host gives."""
        if self.confinement.level == NONE:
            return argv
        return bwrap_argv(argv, mounts, uid=self.uid)

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


def bwrap_argv(argv: list[str], mounts: Mounts, *, uid: int | None) -> list[str]:
    """The bwrap command line that starts ``argv`` in fresh namespaces with
    the system, ``mounts`` and nothing else, as ``uid`` when given."""
    args = [
        "bwrap",
        "--unshare-ipc",
        "--unshare-pid",
        "--unshare-net",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--hostname",
        HOSTNAME,
        "--die-with-parent",
        "--new-session",
    ]
    if uid is None:
        args.append("--unshare-user")  # how bwrap runs without root
    args += system_mounts()
    args += ["--proc", "/proc", "--dev", "/dev"]
    # Before the binds: a job's own directory may live under the host's /tmp.
    for path, size in (("/tmp", TMP_BYTES), ("/dev/shm", SHM_BYTES)):
        args += ["--perms", "1777", "--size", str(size), "--tmpfs", path]
    # bwrap would make missing parents of a mount point 0700 root, which a
    # child of another uid cannot enter.
    inside = [*mounts.read_only, *mounts.writable, *(i for _, i in mounts.aliases)]
    for path in _parents(inside):
        args += ["--perms", "0755", "--dir", path]
    for path in mounts.read_only:
        args += ["--ro-bind", path, path]
    for path in mounts.writable:
        args += ["--bind", path, path]
    for source, inside in mounts.aliases:
        args += ["--bind", source, inside]
    for path in mounts.devices:
        args += ["--dev-bind", path, path]
    args += ["--chdir", mounts.workdir, "--"]
    if uid is not None:
        args += [
            "setpriv",
            f"--reuid={uid}",
            f"--regid={uid}",
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
            "--no-new-privs",
            "--",
        ]
    return args + argv


def _parents(paths: list[str]) -> list[str]:
    """The directories above ``paths`` that the sandbox does not have yet,
    outermost first."""
    found = set()
    for path in paths:
        parent = os.path.dirname(path)
        while parent != "/" and not any(_within(parent, top) for top in _SANDBOX_TREES):
            if parent != "/tmp":  # the private tmpfs, mounted above
                found.add(parent)
            parent = os.path.dirname(parent)
    return sorted(found, key=lambda p: (p.count("/"), p))


@functools.cache
def system_mounts() -> tuple[str, ...]:
    """bwrap arguments for the read-only system every child gets: /usr, the
    merged-/usr links (or directories where /usr is not merged) and the
    loader's configuration."""
    args = ["--ro-bind", "/usr", "/usr"]
    # /etc made before its files are bound: bwrap would make it 0700 root,
    # and a child of another uid could then follow no /etc/alternatives link
    # (CUDA_HOME=/usr/local/cuda -> /etc/alternatives/cuda on many hosts).
    args += ["--perms", "0755", "--dir", "/etc"]
    for path in _MERGED_USR:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    for path in _SYSTEM_FILES:
        if os.path.exists(path):
            args += ["--ro-bind", path, path]
    return tuple(args)


_PROBE = (
    "import json, os, sys; print(json.dumps([sys.prefix, sys.base_prefix, "
    "sys.exec_prefix, sys.base_exec_prefix, os.path.realpath(sys.executable), "
    "*sys.path]))"
)


# Asked once per interpreter and process; a failed answer is asked again.
_TOOLCHAIN_PATHS: dict[str, list[str]] = {}


def toolchain_paths(interpreter: str, protected: tuple[str, ...]) -> tuple[str, ...]:
    """What a child of ``interpreter`` needs to start Python and import its
    packages: its prefixes and every directory on its sys.path, asked of the
    interpreter itself (a .pth file may add one anywhere). A path that is,
    or holds, one of ``protected`` (the repository's var/, with its database
    and keys) is never among them."""
    interpreter = os.path.abspath(interpreter)
    found = [os.path.dirname(interpreter)]
    if interpreter not in _TOOLCHAIN_PATHS:
        try:
            probe = subprocess.run(
                [interpreter, "-I", "-c", _PROBE],
                capture_output=True,
                text=True,
                timeout=60,
                env={"PATH": os.environ.get("PATH", os.defpath)},
            )
            answer = json.loads(probe.stdout)
        except (OSError, ValueError, subprocess.TimeoutExpired):
            answer = None  # the child fails to start and says why
        if isinstance(answer, list):
            _TOOLCHAIN_PATHS[interpreter] = [p for p in answer if isinstance(p, str)]
    return bindable(found + _TOOLCHAIN_PATHS.get(interpreter, []), protected)


def bindable(paths: list[str], protected: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The existing ``paths`` that may be bound into a child, with those
    inside another one left out: never a whole top-level tree of the host
    (``_NEVER_BOUND``), nor one holding a ``protected`` path."""
    kept: list[str] = []
    for raw in paths:
        if not raw or not os.path.isabs(raw) or not os.path.exists(raw):
            continue
        path = os.path.normpath(raw)
        if path in _NEVER_BOUND or any(_within(p, path) for p in protected):
            continue
        if _within(path, "/usr"):
            continue  # every child has /usr already
        kept.append(path)
    kept = sorted(set(kept))
    return tuple(p for p in kept if not any(_within(p, q) for q in kept if q != p))


def _within(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


# The host compilers a toolchain may call: TileLang takes CXX, then CC, for
# the C backend and as nvcc's -ccbin, and falls back to these on PATH.
_COMPILER_VARIABLES = ("CXX", "CC")
_COMPILER_NAMES = ("g++", "gcc", "c++", "cc")
_COMPILER_PARTS = ("lib", "lib64", "libexec", "include")


def compiler_paths() -> tuple[str, ...]:
    """Where this host's C and C++ compilers live, for a child that
    compiles: of each compiler the environment names or PATH finds first
    (links followed), its directory and, for one in a ``bin`` directory,
    the parts of its prefix a compiler reads (``/opt/gcc/{lib,lib64,
    libexec,include}`` for ``/opt/gcc/bin/g++``: its cc1plus, runtime and
    headers), never the whole prefix, which may be a home directory. A
    compiler in /usr needs nothing more; one outside it (CXX set to a g++
    under /opt on the H200 image) was missing in the sandbox, and nvcc
    failed with "No such file or directory"."""
    found = []
    named = [os.environ.get(v) for v in _COMPILER_VARIABLES]
    for name in [n for n in named if n] + list(_COMPILER_NAMES):
        path = shutil.which(name)
        if not path:
            continue
        for one in dict.fromkeys([os.path.abspath(path), os.path.realpath(path)]):
            directory = os.path.dirname(one)
            found.append(directory)
            if os.path.basename(directory) == "bin":
                prefix = os.path.dirname(directory)
                found += [os.path.join(prefix, part) for part in _COMPILER_PARTS]
    return tuple(dict.fromkeys(found))


def device_mounts(kind: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(device nodes, read-only paths) a child needs for a ``kind`` target:
    the compiler's toolkit whether or not this host has the GPU (a
    compile-only runner builds for cuda too), and the GPU's nodes, its
    driver's libraries and /sys where the host has them."""
    if kind not in _TOOLKITS:
        return (), ()
    variables, default = _TOOLKITS[kind]
    toolkits = [os.environ.get(v) or "" for v in variables] + [default]
    read_only = [os.path.realpath(p) for p in toolkits if p]
    devices = gpu_nodes(kind)
    if not devices:
        return (), bindable(read_only)
    read_only += [os.path.dirname(p) for p in driver_libraries(kind)]
    # /sys is a whole tree of the host, bound on purpose: the driver reads
    # the PCI topology there.
    return tuple(devices), (*bindable(read_only), "/sys")


def gpu_nodes(kind: str) -> list[str]:
    """The device nodes of this host's ``kind`` GPUs (/dev/nvidia0,
    /dev/nvidiactl, /dev/nvidia-uvm, ...; /dev/kfd and /dev/dri for ROCm)."""
    return sorted(
        {path for pattern in _DEVICE_NODES[kind] for path in glob.glob(pattern)}
    )


def driver_libraries(kind: str) -> list[str]:
    """Where the loader finds the GPU driver's libraries (libcuda, libnvidia-*
    or the ROCm runtime), from its cache: a container may keep them outside
    /usr (/usr/local/nvidia/lib64)."""
    pattern = _DRIVER_LIBRARIES[kind]
    found = []
    for line in loader_cache().splitlines():
        name, _, path = line.strip().partition(" => ")
        if path and pattern.match(name.split()[0]):
            found.append(os.path.realpath(path))
    return sorted(set(found))


@functools.cache
def loader_cache() -> str:
    """``ldconfig -p``: every library the loader knows, with its path."""
    try:
        return subprocess.run(
            ["ldconfig", "-p"], capture_output=True, text=True, timeout=30
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""


@functools.cache
def confinement() -> Confinement:
    """What a child gets on this host, found once by starting one."""
    missing = []
    root = os.geteuid() == 0 and shutil.which("setpriv") is not None
    if not root:
        missing.append(NO_ROOT)
    problem = _bwrap_problem(uid=LIBRARY_UID if root else None)
    if problem:
        missing.insert(0, f"{NO_BWRAP} ({problem})")
        level = NONE
    else:
        level = FULL if root else NAMESPACES
    found = Confinement(level, tuple(missing))
    if level != FULL:
        log.warning("harness sandbox is %s", found.describe())
    return found


def _bwrap_problem(uid: int | None) -> str | None:
    if shutil.which("bwrap") is None:
        return "bwrap is not installed: apt-get install bubblewrap"
    argv = bwrap_argv(["true"], NO_MOUNTS, uid=uid)
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    if done.returncode != 0:
        return (done.stderr.strip().splitlines() or ["it failed"])[-1]
    return None


def library() -> Identity:
    """The shared identity of trusted library children."""
    found = confinement()
    if found.level != FULL:
        return Identity(uid=None, confinement=found)
    return Identity(uid=LIBRARY_UID, exclusive=False, confinement=found)


def acquire() -> Identity:
    """A uid no other live child (of any supervisor on this host) holds, or
    the supervisor's own identity where it cannot switch users."""
    found = confinement()
    if found.level != FULL:
        return Identity(uid=None, confinement=found)
    _LOCK_DIR.mkdir(mode=0o700, exist_ok=True)
    for uid in UID_RANGE:
        fd = os.open(_LOCK_DIR / str(uid), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        identity = Identity(uid=uid, lock_fd=fd, confinement=found)
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
