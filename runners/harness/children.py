"""Start one sandboxed harness child, supervise it, and turn whatever it
does into results.

Each child starts in the sandbox of ``isolation`` (bubblewrap namespaces, a
filesystem of only what it needs, a uid of its own where the supervisor is
root) in its own process group (killed whole when its job ends or times
out), with an environment built from an allow-list, a temporary HOME
removed afterwards, resource limits, a TileLang kernel cache per toolchain
(a throwaway one for submitted kernels) and a 16 KB cap on what it prints.
What it says on its protocol pipe is checked and rebuilt into the result
schema; a child that dies or hangs costs only the job it was on.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import selectors
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from runners.harness import isolation, warm
from runners.harness.child import UNTRUSTED_MODES
from runners.harness.result import (
    KERNEL_SOURCE_CAP,
    MESSAGE_CAP,
    METRIC_KEYS,
    STAGES,
    STATUSES,
    SUCCESS_FOR_STAGE,
    TIMING_KEYS,
    cap_message,
    cap_text,
    new_result,
    set_error,
    timing_samples_valid,
)
from runners.harness.sanitize import error_signature, sanitize
from runners.harness.stages import DEVICE_LOCK_ENV

log = logging.getLogger(__name__)

REPO_ROOT = str(Path(__file__).resolve().parents[2])
STARTUP_TIMEOUT_S = 180.0
# Called with (index of the job in what was asked, its result) as each job
# ends, from the thread supervising its child.
OnResult = Callable[[int, dict], None]
OUTPUT_CAP = 16 * 1024
PROTOCOL_LINE_CAP = 1024 * 1024
CRASH_TAIL = 2048
# What a child that runs submitted code may keep under its HOME (its kernel
# cache, temp files and outputs): on the host's disk, where the per-file
# limit alone let one job write 2.4 GB in files of 200 MB. An executor may
# write this many outputs of ``file_bytes`` on top (each run on each input
# set, and the timed calls').
HOME_QUOTA_BYTES = 2**30
OUTPUT_FILES_MAX = 24
QUOTA_CHECK_S = 0.25

# Passed through to the child when set, and nothing else. Not TVM_LIBRARY_PATH
# nor TL_TEMPLATE_PATH: importing TileLang sets them in the supervisor to its
# own install, and a child of another toolchain would load that one's
# libraries; each child's TileLang sets them to its own.
ENV_ALLOW = (
    "PATH",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TZ",
    "LD_LIBRARY_PATH",
    "CC",
    "CXX",
    "OMP_NUM_THREADS",
    "CUDA_HOME",
    "CUDA_PATH",
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    "CUDA_MODULE_LOADING",
    "NVIDIA_VISIBLE_DEVICES",
    "ROCM_PATH",
    "ROCM_HOME",
    "HIP_PATH",
    "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "HSA_OVERRIDE_GFX_VERSION",
    "TVM_NUM_THREADS",
    "TILELANG_EXECUTION_BACKEND",
    "TILELANG_COMPILE_TIMEOUT_SECONDS",
)
# Belt and braces: even an allowed name is dropped when it looks like a secret.
_SECRET_NAME = re.compile(r"SECRET|TOKEN|KEY|PASSW|CREDENTIAL|AUTH|COOKIE|SESSION")


@dataclass(frozen=True)
class Limits:
    """Resource limits of one child. The address-space limit applies to CPU
    targets only (CUDA and ROCm reserve far more virtual memory than they use)
    and counts on top of what the toolchain maps at import, which is itself
    16 GB for a CUDA build of torch. Where it does not apply, the data limit
    does: writable private memory (the heap, anonymous mappings), not the
    address space a GPU driver reserves without writing it."""

    cpu_s: int
    file_bytes: int = 4 * 2**30
    processes: int = 4096
    address_space_extra_bytes: int | None = 16 * 2**30
    data_extra_bytes: int = 32 * 2**30
    core_bytes: int = 0  # a core dump would hold tensor data and environment


def untrusted_limits(limits: Limits) -> Limits:
    """Tighter limits for a child that runs submitted code: an 8 GB
    allocation, a 1 GB file or a fork bomb fails inside it."""
    extra = limits.address_space_extra_bytes
    return replace(
        limits,
        file_bytes=256 * 2**20,
        processes=256,
        address_space_extra_bytes=None if extra is None else 4 * 2**30,
        data_extra_bytes=8 * 2**30,
    )


def child_environment(home: str, cache_dir: str) -> dict[str, str]:
    env = {
        name: os.environ[name]
        for name in ENV_ALLOW
        if name in os.environ and not _SECRET_NAME.search(name)
    }
    env.setdefault("PATH", os.defpath)
    tmp = os.path.join(home, "tmp")
    os.makedirs(tmp, exist_ok=True)
    env.update(
        HOME=home,
        TMPDIR=tmp,
        XDG_CACHE_HOME=os.path.join(home, ".cache"),
        TILELANG_CACHE_DIR=cache_dir,
        TILELANG_TMP_DIR=os.path.join(cache_dir, "tmp"),
        TILELANG_PRINT_ON_COMPILATION="0",
        PYTHONPATH=REPO_ROOT,
        PYTHONNOUSERSITE="1",
        PYTHONDONTWRITEBYTECODE="1",
        PYTHONUNBUFFERED="1",
    )
    return env


def run_child(
    jobs: list[dict],
    *,
    interpreter: str,
    cache_dir: str | None,
    timeout_s: float,
    mode: str = "library",
    extra: dict | None = None,
    mounts: isolation.Mounts = isolation.NO_MOUNTS,
    collect=None,
    on_waiting=None,
    file_bytes: int | None = None,
    on_start=None,
    on_result: OnResult | None = None,
    keep_warm: bool = False,
) -> list[dict]:
    """Run ``jobs`` in one child until they are done or the child dies or
    hangs. Returns the results of the jobs it finished and, if it failed,
    the failure of the job it was on; nothing when ``on_waiting`` (asked
    when the child waits to go on) said no. ``on_result(index, result)``
    hears of each job as it ends.

    The child's HOME is ``BASE/home``; BASE itself stays the supervisor's, so
    the child cannot swap the directory that ``collect(BASE)`` reads after it
    is gone. ``mounts`` are host paths the child sees besides its own.

    With ``keep_warm``, trusted library jobs with a shared kernel cache run
    in a child kept from an earlier call where one is idle (see ``warm``),
    and the child is kept for the next call when it ends well.
    """
    timeouts = [job["timeout_s"] or timeout_s for job in jobs]
    warm_key = None
    if keep_warm and mode == "library" and cache_dir is not None:
        warm_key = (
            interpreter,
            os.path.abspath(cache_dir),
            tuple(sorted({job["target"]["kind"] for job in jobs})),
            tuple(os.environ.get(name) for name in ENV_ALLOW),
        )
        spawned = warm.take(warm_key)
        if spawned is not None:
            return _run_in(spawned, jobs, timeouts, on_result, warm_key)
    spawned = _spawn(
        jobs,
        timeouts,
        interpreter=interpreter,
        cache_dir=cache_dir,
        mode=mode,
        extra=extra,
        mounts=mounts,
        file_bytes=file_bytes,
        interactive=on_waiting is not None or warm_key is not None,
        persistent=warm_key is not None,
    )
    if warm_key is not None:
        return _run_in(spawned, jobs, timeouts, on_result, warm_key)
    try:
        if on_start is not None:
            on_start(spawned.child)
        try:
            results = _supervise(
                spawned, jobs, timeouts, on_waiting, _with_sandbox(spawned, on_result)
            )
        finally:
            spawned.child.kill()
            spawned.identity.kill_all()
            if collect is not None:
                collect(spawned.base)
        return results
    finally:
        _dispose(spawned)


@dataclass
class Spawned:
    """A started child and what it was started with: its directory (BASE,
    with HOME below), identity, kernel cache, the paths that are its own
    (named by their file only in what it says) and, once it said so, its
    toolchain's fingerprint."""

    child: Child
    base: str
    identity: isolation.Identity
    private: tuple[str, ...]
    born: float
    toolchain: dict | None = None
    jobs_run: int = 0

    def end(self) -> None:
        """Kill the child and everything of its uid, remove its directory."""
        self.child.kill()
        self.identity.kill_all()
        _dispose(self)


def _spawn(
    jobs: list[dict],
    timeouts: list[float],
    *,
    interpreter: str,
    cache_dir: str | None,
    mode: str,
    extra: dict | None,
    mounts: isolation.Mounts,
    file_bytes: int | None,
    interactive: bool,
    persistent: bool,
) -> Spawned:
    base = tempfile.mkdtemp(prefix="tm-harness-")
    os.chmod(base, 0o755)
    home = os.path.join(base, "home")
    os.mkdir(home, 0o700)
    born = time.perf_counter()
    shared_cache = cache_dir is not None and mode == "library"
    identity = isolation.library() if shared_cache else isolation.acquire()
    try:
        cache = (
            os.path.abspath(cache_dir)
            if shared_cache
            else os.path.join(home, "tilelang-cache")
        )
        # A warm child's CPU limit covers its whole life (warm.MAX_AGE_S of
        # jobs) on every core, as a CPU reference's threads may use them
        # all; each job still has its own timeout.
        budget = warm.MAX_AGE_S * (os.cpu_count() or 1) if persistent else sum(timeouts)
        limits = Limits(cpu_s=math.ceil(2 * (STARTUP_TIMEOUT_S + budget)))
        # The builder only calls program() and never maps a GPU: it keeps the
        # cap on every target (a cuda job's builder allocated 6 GB without it).
        if mode != "builder" and any(job["target"]["kind"] != "c" for job in jobs):
            limits = replace(limits, address_space_extra_bytes=None)
        if mode in UNTRUSTED_MODES:
            limits = untrusted_limits(limits)
        if file_bytes is not None:
            limits = replace(limits, file_bytes=max(limits.file_bytes, file_bytes))
        spec = {
            # Only the builder gets the submitted text.
            "jobs": [
                job if mode == "builder" else {**job, "source": None} for job in jobs
            ],
            "limits": asdict(limits),
            "mode": mode,
            "persistent": persistent,
            **(extra or {}),
        }
        spec_path = Path(base, "spec.json")
        spec_path.write_text(json.dumps(spec))
        env = child_environment(
            home, identity.cache_path(cache) if shared_cache else cache
        )
        if all(job["target"]["kind"] == "c" for job in jobs):
            # A CPU kernel runs, and is timed, on one thread, and its inputs
            # are small: torch's other threads only spin while the host is
            # busy (a comparison of 262k floats took 32 ms on one thread and
            # 490 ms on two, on 2 cores under load). A value the runner's
            # environment sets is kept.
            env.setdefault("OMP_NUM_THREADS", "1")
        if shared_cache:
            env[DEVICE_LOCK_ENV] = os.path.join(
                env["TILELANG_CACHE_DIR"], "tilematrix-device.lock"
            )
            _own_cache(cache, identity)
        identity.give(home)
        # The builder only calls program(): no toolkit, no GPU.
        kinds = set() if mode == "builder" else {j["target"]["kind"] for j in jobs}
        child_mounted = child_mounts(
            interpreter,
            home=home,
            spec=str(spec_path),
            trusted=mode not in UNTRUSTED_MODES,
            kinds=kinds,
            extra=mounts,
            cache=cache if shared_cache else None,
        )

        quota = None
        if mode in UNTRUSTED_MODES:
            quota = HOME_QUOTA_BYTES + OUTPUT_FILES_MAX * (file_bytes or 0)

        def start() -> Child:
            return Child(
                interpreter,
                spec_path,
                env,
                identity,
                child_mounted,
                mode=mode,
                interactive=interactive,
                home=(home, quota) if quota else None,
            )

        child = warm.start_in_keeper(start) if persistent else start()
    except BaseException:
        identity.release()
        shutil.rmtree(base, ignore_errors=True)
        raise
    # The child's sandbox and kernel cache are this run's or this host's
    # own: a path in them is named by its file only.
    private = (base, cache, env["TILELANG_CACHE_DIR"])
    return Spawned(child, base, identity, private, born)


def _with_sandbox(spawned: Spawned, on_result: OnResult | None) -> OnResult:
    def ended(index: int, result: dict) -> None:
        result["sandbox"] = spawned.identity.confinement.describe()
        if on_result is not None:
            on_result(index, result)

    return ended


def _run_in(
    spawned: Spawned, jobs: list[dict], timeouts, on_result, warm_key
) -> list[dict]:
    """Run ``jobs`` in a warm child (started for them or kept idle), then
    keep it for the next call if it ended well, or end it."""
    kept = False
    try:
        if spawned.jobs_run and not spawned.child.send_jobs(jobs):
            # It died while idle: nothing of these jobs ran in it.
            return []
        results = _supervise(
            spawned, jobs, timeouts, None, _with_sandbox(spawned, on_result)
        )
        spawned.jobs_run += len(results)
        kept = (
            len(results) == len(jobs)
            and results[-1]["status"] != "runtime_error"
            and spawned.child.proc.poll() is None
            and warm.put(warm_key, spawned)
        )
        return results
    finally:
        if not kept:
            spawned.end()


def _dispose(spawned: Spawned) -> None:
    spawned.identity.release()
    shutil.rmtree(spawned.base, ignore_errors=True)


def child_mounts(
    interpreter: str,
    *,
    home: str,
    spec: str,
    trusted: bool,
    kinds: set[str],
    extra: isolation.Mounts = isolation.NO_MOUNTS,
    cache: str | None = None,
) -> isolation.Mounts:
    """What one child sees: its toolchain, the harness code (the operator
    library, with the references, only where ``trusted``), its spec, its
    HOME, the shared kernel cache, the toolkits and GPUs of ``kinds``."""
    code = ["runners/__init__.py", "runners/harness"]
    if trusted:
        code.append("runners/kernels")
    # The libraries the child's loader is pointed at come with it.
    library_path = os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep)
    read_only = [
        *isolation.toolchain_paths(interpreter, protected_paths()),
        *isolation.bindable(library_path, protected_paths()),
        *(os.path.join(REPO_ROOT, path) for path in code),
        spec,
        *extra.read_only,
    ]
    if kinds:
        read_only += isolation.bindable(
            list(isolation.compiler_paths()), protected_paths()
        )
    devices: list[str] = []
    for kind in sorted(kinds):
        nodes, paths = isolation.device_mounts(kind)
        devices += nodes
        read_only += paths
    return isolation.Mounts(
        read_only=tuple(dict.fromkeys(read_only)),
        writable=(home, *extra.writable),
        aliases=((cache, isolation.CACHE_POINT),) if cache else (),
        devices=tuple(devices),
        workdir=home,
    )


def protected_paths() -> tuple[str, ...]:
    """Host paths no child may see through a toolchain path that holds them:
    the service's var/ (database, secret key, server and runner keys)."""
    found = [os.path.join(REPO_ROOT, "var")]
    if os.environ.get("TILEMATRIX_VAR_DIR"):
        found.append(os.path.abspath(os.environ["TILEMATRIX_VAR_DIR"]))
    return tuple(found)


def _own_cache(cache: str, identity: isolation.Identity) -> None:
    """Give a shared kernel cache to the library children's uid, once."""
    os.makedirs(cache, exist_ok=True)
    if identity.uid is not None and os.stat(cache).st_uid != identity.uid:
        identity.give(cache)


def _supervise(spawned: Spawned, jobs, timeouts, on_waiting, on_result) -> list[dict]:
    """The results of ``jobs`` as the child sends them, until they are all
    in (the child lives on) or it fails (it is killed)."""
    child, private = spawned.child, spawned.private
    results: list[dict] = []

    def ended(result: dict) -> None:
        results.append(result)
        on_result(len(results) - 1, result)

    # A warm child said which toolchain it is when it started.
    toolchain = spawned.toolchain
    # ``sent``: the source an executor sent before its kernel first ran.
    current, stage, waited, sent = None, None, False, None
    mark = time.perf_counter() if toolchain else spawned.born
    deadline = mark + STARTUP_TIMEOUT_S
    while True:
        message = child.next_message(deadline)
        if message is None or message == "eof":
            break
        event = message.get("event")
        if event == "ready" and toolchain is None:
            toolchain = spawned.toolchain = message.get("fingerprint")
        elif event == "start" and toolchain and current is None:
            if message.get("index") != len(results):
                child.notes.append("the harness child started jobs out of order")
                break
            current, stage, sent = len(results), None, None
            deadline = time.perf_counter() + timeouts[current]
        elif event == "stage" and current is not None:
            stage = message.get("stage") if message.get("stage") in STAGES else stage
            if child.mode == "executor" and stage == "validate" and sent is None:
                said = message.get("kernel_source")
                sent = said if isinstance(said, str) else ""
        elif event == "waiting" and current is not None and on_waiting and not waited:
            waited = True
            if not on_waiting():
                return results
            child.go()
            deadline = time.perf_counter() + timeouts[current]
        elif event == "result" and current is not None:
            accepted = _accept(message.get("result"), jobs[current], toolchain, child)
            if sent is not None:
                # What the kernel's process says after the kernel ran is not
                # what the cell page shows.
                accepted["kernel_source"] = cap_text(sent, KERNEL_SOURCE_CAP) or None
            # What a builder leaves counts once it has exited, not when
            # something in it claimed to be done.
            if child.mode == "builder" and not child.wait_exit(deadline):
                text = f"the builder did not exit within {timeouts[current]:g}s"
                accepted = _failed(jobs[current], "timeout", text, stage, toolchain)
            finished = finish(accepted, mark, private)
            _progress(finished, time.perf_counter() - mark)
            ended(finished)
            mark = time.perf_counter()
            current = None
            deadline = mark + STARTUP_TIMEOUT_S
        elif event == "broken":
            child.notes.append(str(message.get("message", "")))
        if len(results) == len(jobs):
            return results

    timed_out = message is None
    child.kill()
    if toolchain is None:
        # The toolchain never came up: no job of this group can run here.
        if timed_out:
            text = f"the harness child did not start within {STARTUP_TIMEOUT_S:g}s"
        else:
            text = "the harness child failed to start: " + child.describe_exit()
        for job in jobs:
            ended(finish(_failed(job, "infra_error", text, None, None), mark, private))
        return results
    if current is None and results and not timed_out:
        return results  # it left after a runtime error; the rest get a new child
    index = len(results) if current is None else current
    job = jobs[index]
    if current is None:
        status = "infra_error"
        text = "the harness child stopped between jobs: " + child.describe_exit()
    elif timed_out:
        status = "timeout"
        text = (
            f"no result within {timeouts[index]:g}s (stage {stage or 'lower'}); "
            "its process group was killed"
        )
    elif child.over_quota is not None:
        status = "runtime_error"
        text = (
            "a sandbox limit was reached: its HOME held "
            f"{child.over_quota / 2**20:.0f} MB, more than "
            f"{child.home_quota[1] / 2**20:.0f} MB"
        )
    elif child.cpu_limit_hit():
        status, text = "timeout", "the CPU time limit was reached"
    else:
        status = "runtime_error"
        text = "the kernel process died: " + child.describe_exit()
    ended(finish(_failed(job, status, text, stage, toolchain), mark, private))
    return results


def _progress(result: dict, seconds: float) -> None:
    """A line per finished job, so a long batch shows how far it got."""
    log.info(
        "%s %s %s on %s: %s in %.1fs",
        result.get("operator"),
        result.get("shape"),
        result.get("dtype"),
        (result.get("target") or {}).get("kind"),
        result.get("status"),
        seconds,
    )


def _failed(job, status, message, stage, toolchain) -> dict:
    result = new_result(job)
    result["stage_reached"] = stage
    if toolchain:
        result["fingerprint"] = toolchain
    return set_error(result, status, message)


def _accept(result: object, job: dict, toolchain: dict, child: Child) -> dict:
    """Rebuild the child's result from the job and the fields a result may
    have, so that a confused (or hostile) child cannot change the echo of
    the job or break the schema."""
    clean = new_result(job)
    clean["fingerprint"] = toolchain
    try:
        _copy_checked(result, clean)
    except (KeyError, TypeError, ValueError):
        text = "the harness child sent a malformed result"
        # Submitted code can write to the channel: its garbage is its failure.
        status = "runtime_error" if child.untrusted else "infra_error"
        return _failed(job, status, text, None, toolchain)
    if child.mode == "builder" and clean["status"] == "infra_error":
        # The builder's own code never says so: submitted code said it, to
        # be retried as the runner's fault.
        clean["status"] = "runtime_error"
    return clean


def _copy_checked(result: dict, clean: dict) -> None:
    def require(condition: bool) -> None:
        if not condition:
            raise ValueError

    status, stage, error = result["status"], result["stage_reached"], result["error"]
    require(status in STATUSES and (stage is None or stage in STAGES))
    require((error is None) == (status in SUCCESS_FOR_STAGE.values()))
    clean["status"], clean["stage_reached"] = status, stage
    for group, keys in (("metrics", METRIC_KEYS), ("timings", TIMING_KEYS)):
        for key in keys:
            value = result[group][key]
            require(value is None or isinstance(value, (int, float)))
            clean[group][key] = value
    if error is not None:
        message, pass_name = error["message"], error["pass_name"]
        require(isinstance(message, str))
        require(pass_name is None or isinstance(pass_name, str))
        clean["error"] = {"signature": None, "message": message, "pass_name": pass_name}
    source, tolerance = result["kernel_source"], result["tolerance"]
    require(source is None or isinstance(source, str))
    require(tolerance is None or isinstance(tolerance, dict))
    clean["kernel_source"] = cap_text(source, KERNEL_SOURCE_CAP) if source else source
    clean["tolerance"] = tolerance
    distributions = result.get("distributions")
    require(
        distributions is None
        or (
            isinstance(distributions, list)
            and len(distributions) <= 16
            and all(isinstance(d, str) and len(d) <= 40 for d in distributions)
        )
    )
    clean["distributions"] = distributions
    samples = result.get("timing_samples")
    require(samples is None or timing_samples_valid(samples))
    clean["timing_samples"] = samples


def finish(result: dict, since: float, private: tuple[str, ...]) -> dict:
    """Sanitize what the child said, sign its error, and account the time."""
    roots = (REPO_ROOT,)
    if result.get("error"):
        message = sanitize(result["error"]["message"], roots=roots, private=private)
        message = cap_message(message, MESSAGE_CAP)
        result["error"]["message"] = message
        result["error"]["signature"] = error_signature(message)
    if result.get("kernel_source"):
        result["kernel_source"] = sanitize(
            result["kernel_source"], roots=roots, private=private, keep_data=True
        )
    timings = result["timings"]
    timings["wall_s"] = time.perf_counter() - since
    spent = (timings.get("compile_s") or 0.0) + (timings.get("run_s") or 0.0)
    timings["overhead_s"] = max(0.0, timings["wall_s"] - spent)
    return result


def tree_bytes(path: str) -> int:
    """The bytes on disk under ``path``, links not followed."""
    total = 0
    stack = [path]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:
            continue
        for entry in entries:
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            total += info.st_blocks * 512
            if entry.is_dir(follow_symlinks=False):
                stack.append(entry.path)
    return total


class Child:
    """One child process and the pipes it talks on."""

    def __init__(
        self,
        interpreter: str,
        spec: Path,
        env: dict,
        identity: isolation.Identity,
        mounts: isolation.Mounts,
        *,
        mode: str,
        interactive: bool,
        home: tuple[str, int] | None = None,
    ):
        self.mode = mode
        # (path, bytes): the HOME whose size is watched, and its quota.
        self.home_quota = home
        self.over_quota: int | None = None
        self._next_quota_check = 0.0
        self.untrusted = mode in UNTRUSTED_MODES
        self.wrapped = identity.confinement.level != isolation.NONE
        # -P: the child's own cwd (its HOME) never shadows the harness.
        argv = [
            os.path.abspath(interpreter) if os.sep in interpreter else interpreter,
            "-P",
            "-m",
            "runners.harness.child",
            str(spec),
        ]
        self.proc = subprocess.Popen(
            identity.command(argv, mounts),
            cwd=mounts.workdir,
            env=env,
            stdin=subprocess.PIPE if interactive else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.proc.stdout, selectors.EVENT_READ, "protocol")
        self.selector.register(self.proc.stderr, selectors.EVENT_READ, "output")
        self.line = bytearray()
        self.output = bytearray()
        self.output_total = 0
        self.notes: list[str] = []
        self.open_streams = 2

    def next_message(self, deadline: float):
        """The next protocol message, "eof" once the child closed its output,
        or None when ``deadline`` passed first."""
        while True:
            newline = self.line.find(b"\n")
            if newline >= 0:
                raw, self.line = bytes(self.line[:newline]), self.line[newline + 1 :]
                try:
                    message = json.loads(raw)
                except ValueError:
                    continue
                if isinstance(message, dict):
                    return message
                continue
            if len(self.line) > PROTOCOL_LINE_CAP:
                return "eof"
            if self.open_streams == 0:
                return "eof"
            if self._home_over_quota():
                return "eof"
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                return None
            if self.home_quota:
                remaining = min(remaining, QUOTA_CHECK_S)
            for key, _ in self.selector.select(timeout=remaining):
                chunk = os.read(key.fileobj.fileno(), 65536)
                if not chunk:
                    self.selector.unregister(key.fileobj)
                    self.open_streams -= 1
                elif key.data == "protocol":
                    self.line += chunk
                else:
                    self._keep_output(chunk)

    def _home_over_quota(self) -> bool:
        """Kill the child once its HOME holds more than its quota."""
        if self.over_quota is not None:
            return True
        if not self.home_quota or time.perf_counter() < self._next_quota_check:
            return False
        self._next_quota_check = time.perf_counter() + QUOTA_CHECK_S
        path, quota = self.home_quota
        used = tree_bytes(path)
        if used <= quota:
            return False
        self.over_quota = used
        self.signal_kill()
        return True

    def send_jobs(self, jobs: list[dict]) -> bool:
        """Give a warm child its next jobs; False if it is gone."""
        line = json.dumps({"jobs": [{**job, "source": None} for job in jobs]})
        try:
            self.proc.stdin.write(line.encode() + b"\n")
            self.proc.stdin.flush()
        except OSError:
            return False
        return True

    def go(self) -> None:
        """Let a child waiting on its stdin go on."""
        try:
            self.proc.stdin.write(b"go\n")
            self.proc.stdin.flush()
        except OSError:
            pass  # it is gone; the next message says so

    def wait_exit(self, deadline: float) -> bool:
        """Whether the child exited by ``deadline``; what it still says is
        dropped."""
        while self.proc.poll() is None:
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                return False
            if self.next_message(time.perf_counter() + min(remaining, 0.1)) == "eof":
                try:
                    self.proc.wait(timeout=remaining)
                except subprocess.TimeoutExpired:
                    return False
        return True

    def _keep_output(self, chunk: bytes) -> None:
        # Keep the tail: a crash explains itself last.
        self.output_total += len(chunk)
        self.output += chunk
        del self.output[: max(0, len(self.output) - OUTPUT_CAP)]

    def signal_kill(self) -> None:
        """SIGKILL the whole process group (its sandbox's init with it, which
        takes every process of the sandbox along); safe from any thread."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def kill(self) -> None:
        """Kill the whole process group, the compilers it started included,
        then reap the child."""
        self.signal_kill()
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()
        self.selector.close()

    def cpu_limit_hit(self) -> bool:
        return self._killed_by() == signal.SIGXCPU

    def _killed_by(self) -> int | None:
        """The signal that ended the child, if one did: bwrap passes on its
        command's death by signal N as exit status 128 + N."""
        code = self.proc.returncode
        if code is None:
            return None
        if code < 0:
            return -code
        if self.wrapped and code > 128:
            return code - 128
        return None

    def describe_exit(self) -> str:
        if self.proc.poll() is None:
            self.proc.wait()
        number = self._killed_by()
        try:
            how = f"killed by {signal.Signals(number).name}"
        except ValueError:
            how = f"exit status {self.proc.returncode}"
        tail = "\n".join(self.notes) or self.output[-CRASH_TAIL:].decode(
            errors="replace"
        )
        return f"{how}\n{tail}".rstrip()
