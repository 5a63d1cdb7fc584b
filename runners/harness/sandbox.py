"""Run jobs in sandboxed children and turn whatever happens into results.

Each child starts in the sandbox of ``isolation`` (bubblewrap namespaces, a
filesystem of only what it needs, a uid of its own where the supervisor is
root) in its own process group (killed whole when its job ends or times
out), with an environment built from an allow-list, a temporary HOME
removed afterwards, resource limits, a TileLang kernel cache per toolchain
(a throwaway one for submitted kernels) and a 16 KB cap on what it prints.
Trusted library jobs of one toolchain share a child, one job after another;
a child that crashes or hangs costs only its current job, and the rest
continue in a fresh one.

A submitted kernel runs in three children (see ``submitted``): a builder
that imports it and hands over only its PrimFunc as TVM JSON, an executor
that never imports submitted code and compiles, runs and times that
program, and a judge that never imports submitted code nor runs the kernel,
which draws the inputs and decides pass or mismatch. They run only where
the sandbox is whole (``isolation.FULL``).
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import secrets
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from runners.harness import isolation, tensors, timing
from runners.harness.child import UNTRUSTED_MODES
from runners.harness.job import lookup_operator, parse_job
from runners.harness.result import (
    FAILURES,
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
)
from runners.harness.sanitize import error_signature, sanitize
from runners.harness.stages import DEVICE_LOCK_ENV
from runners.harness.submitted import PROGRAM_CAP, PROGRAM_NAME

log = logging.getLogger(__name__)

REPO_ROOT = str(Path(__file__).resolve().parents[2])
DEFAULT_TIMEOUT_S = 300.0
STARTUP_TIMEOUT_S = 180.0
OUTPUT_CAP = 16 * 1024
PROTOCOL_LINE_CAP = 1024 * 1024
CRASH_TAIL = 2048

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
    16 GB for a CUDA build of torch."""

    cpu_s: int
    file_bytes: int = 4 * 2**30
    processes: int = 4096
    address_space_extra_bytes: int | None = 16 * 2**30
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


def run_job(
    job: dict,
    *,
    interpreter: str = sys.executable,
    cache_dir: str,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    trusted: bool = True,
) -> dict:
    """Run one job in a fresh sandboxed child and return its result.

    Raises ``MalformedJob`` before starting anything if the job is malformed.
    """
    (result,) = run_batch(
        [job],
        interpreter=interpreter,
        cache_dir=cache_dir,
        timeout_s=timeout_s,
        trusted=trusted,
    )
    return result


def compile_workers() -> int:
    """Children compiling side by side: the host's cores, up to 16 (each child
    holds torch and TileLang, about 1.5 GB)."""
    return int(
        os.environ.get("TILEMATRIX_COMPILE_WORKERS") or min(16, os.cpu_count() or 1)
    )


def run_batch(
    jobs: Iterable[dict],
    *,
    interpreter: str = sys.executable,
    cache_dir: str,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    trusted: bool = True,
    workers: int = 1,
) -> list[dict]:
    """Run jobs of one toolchain; results come back in the jobs' order.

    Trusted library jobs share children (``workers`` of them at a time, each
    taking every ``workers``-th job); a job with submitted source, or any job
    when ``trusted`` is false, gets a child and a kernel cache of its own.
    ``timeout_s`` applies to each job that does not name its own.
    """
    parsed = [parse_job(job) for job in jobs]
    workers = max(1, workers)
    shared = [i for i, job in enumerate(parsed) if trusted and job["source"] is None]
    # (job indices, kernel cache): None asks for a throwaway cache.
    groups = [(shared[w::workers], cache_dir) for w in range(workers)]
    groups += [([i], None) for i in sorted(set(range(len(parsed))) - set(shared))]
    groups = [(indices, cache) for indices, cache in groups if indices]

    def run_group(group: tuple[list[int], str | None]) -> list[dict]:
        indices, cache = group
        group_jobs = [parsed[i] for i in indices]
        if group_jobs[0]["source"] is not None:
            (job,) = group_jobs
            return [_run_submitted(job, interpreter=interpreter, timeout_s=timeout_s)]
        return _run_group(
            group_jobs, interpreter=interpreter, cache_dir=cache, timeout_s=timeout_s
        )

    results: list[dict | None] = [None] * len(parsed)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for (indices, _), group_results in zip(
            groups, pool.map(run_group, groups), strict=True
        ):
            for i, result in zip(indices, group_results, strict=True):
                results[i] = result
    return results


def _run_group(
    jobs: list[dict], *, interpreter: str, cache_dir: str | None, timeout_s: float
) -> list[dict]:
    results: list[dict] = []
    while len(results) < len(jobs):
        pending = jobs[len(results) :]
        results += _run_child(
            pending, interpreter=interpreter, cache_dir=cache_dir, timeout_s=timeout_s
        )
    return results


# How the timings of a submitted kernel are marked in its result.
SUBMITTED_TIMING = (
    "submitted: timed in a process that imported no submitted Python; the "
    "kernel's own code ran there and can skew its own time"
)


def _run_submitted(job: dict, *, interpreter: str, timeout_s: float) -> dict:
    """Build, execute and judge a submitted kernel in three children."""
    from runners.kernels.base import Unsupported

    started = time.perf_counter()
    confinement = isolation.confinement()
    if confinement.level != isolation.FULL:
        refused = set_error(
            new_result(job),
            "infra_error",
            "this runner does not run submitted kernels: its sandbox is "
            + confinement.describe(),
        )
        refused["sandbox"] = confinement.describe()
        return _finish(refused, started, ())
    operator = lookup_operator(job["operator"])
    shape, dtype = job["shape"], job["dtype"]
    try:
        operator.check(shape, dtype, job["target"])
    except Unsupported as exc:
        (result,) = _run_child(
            [job],
            interpreter=interpreter,
            cache_dir=None,
            timeout_s=timeout_s,
            mode="executor",
            extra={"unsupported": str(exc)},
        )
        return result
    exchange = tempfile.mkdtemp(prefix="tm-exchange-")
    try:
        result = _submitted_children(
            job,
            operator,
            interpreter=interpreter,
            timeout_s=timeout_s,
            exchange=Path(exchange),
        )
    finally:
        shutil.rmtree(exchange, ignore_errors=True)
    result["timing_trust"] = SUBMITTED_TIMING
    return _account(result, started)


class _Handoff:
    """What the children of one submitted kernel wait on; each is set once,
    by the thread of the child it comes from, True or False. Once one of
    them fails, ``stop`` kills the others, wherever they are."""

    def __init__(self):
        self.program = Future()  # the builder's program is in the exchange
        self.inputs = Future()  # the judge wrote the input sets
        self.outputs = Future()  # the executor's outputs are in the exchange
        self.stopped_by: str | None = None
        self._children: list[_Child] = []
        self._lock = threading.Lock()

    @staticmethod
    def settle(future: Future, value: bool) -> None:
        if not future.done():
            future.set_result(value)

    def started(self, child: _Child) -> None:
        with self._lock:
            self._children.append(child)
            if self.stopped_by:
                child.signal_kill()

    def stop(self, by: str) -> None:
        with self._lock:
            self.stopped_by = self.stopped_by or by
            for child in self._children:
                child.signal_kill()


def _submitted_children(
    job: dict, operator, *, interpreter: str, timeout_s: float, exchange: Path
) -> dict:
    """Start builder, executor and judge side by side: the executor waits for
    the program and the inputs, the judge for the outputs. Returns the first
    failure on the way, or the executor's evidence with the judge's verdict."""
    shape, dtype = job["shape"], job["dtype"]
    in_specs = [tensors.spec_dict(s) for s in operator.inputs(shape, dtype)]
    out_specs = [tensors.spec_dict(s) for s in operator.outputs(shape, dtype)]
    validate = job["stage"] == "validate"
    # The second seed is drawn here, so nothing can be prepared for it.
    seeds = [job["seed"], secrets.randbelow(2**63)]
    program_dir, inputs_dir, outputs_dir = (
        exchange / name for name in ("program", "inputs", "outputs")
    )
    for directory in (program_dir, inputs_dir, outputs_dir):
        directory.mkdir(mode=0o755)
    # The judge runs as a uid of its own and writes the inputs here; only
    # its sandbox has this directory writable (the executor's reads it).
    inputs_dir.chmod(0o777)
    handoff = _Handoff()
    run = dict(jobs=[job], interpreter=interpreter, cache_dir=None, timeout_s=timeout_s)

    def builder() -> list[dict]:
        copied = []

        def collect(base: str) -> None:
            copied.append(
                copy_child_file(
                    base,
                    ("home", "out", PROGRAM_NAME),
                    program_dir / PROGRAM_NAME,
                    cap=PROGRAM_CAP,
                )
            )

        try:
            results = _run_child(
                **run, mode="builder", collect=collect, on_start=handoff.started
            )
            # A program left by a builder that then failed is not its program.
            written = copied == [True] and results[0]["status"] not in FAILURES
            handoff.settle(handoff.program, written)
            return results
        finally:
            handoff.settle(handoff.program, False)
            if not handoff.program.result():
                handoff.stop("builder")

    def executor() -> list[dict]:
        def may_go() -> bool:
            if not handoff.program.result():
                return False
            return not validate or handoff.inputs.result()

        def collect(base: str) -> None:
            # What is missing or malformed is left out: the judge finds
            # that output never written.
            for input_set in range(len(seeds)):
                for index, spec in enumerate(out_specs):
                    name = tensors.output_name(input_set, index)
                    copy_child_file(
                        base,
                        ("home", "out", name),
                        outputs_dir / name,
                        size=tensors.byte_size(spec),
                    )

        try:
            results = _run_child(
                **run,
                mode="executor",
                extra={
                    "program": str(program_dir / PROGRAM_NAME),
                    "inputs": in_specs,
                    "outputs": out_specs,
                    "inputs_dir": str(inputs_dir),
                    "input_sets": len(seeds),
                },
                mounts=isolation.Mounts(read_only=(str(program_dir), str(inputs_dir))),
                on_waiting=may_go,
                collect=collect if validate else None,
                file_bytes=max(tensors.byte_size(s) for s in out_specs),
                on_start=handoff.started,
            )
            # "pass" from the executor means "outputs written", which only
            # the judge can check.
            handoff.settle(
                handoff.outputs, bool(results) and results[0]["status"] == "pass"
            )
            return results
        finally:
            handoff.settle(handoff.outputs, False)
            if validate and not handoff.outputs.result():
                handoff.stop("executor")

    def judge() -> list[dict]:
        def may_go() -> bool:
            handoff.settle(handoff.inputs, True)
            return handoff.outputs.result()

        try:
            return _run_child(
                **run,
                mode="judge",
                extra={
                    "seeds": seeds,
                    "inputs_dir": str(inputs_dir),
                    "outputs_dir": str(outputs_dir),
                },
                mounts=isolation.Mounts(
                    read_only=(str(outputs_dir),), writable=(str(inputs_dir),)
                ),
                on_waiting=may_go,
                on_start=handoff.started,
            )
        finally:
            handoff.settle(handoff.inputs, False)
            if not handoff.inputs.result():
                handoff.stop("judge")

    with ThreadPoolExecutor(max_workers=3) as pool:
        built = pool.submit(builder)
        judged = pool.submit(judge) if validate else None
        executed = pool.submit(executor)
        wait([built, executed, *([judged] if judged else [])])
    (program,) = built.result()
    ran = executed.result()
    verdict = judged.result() if judged else []
    if handoff.stopped_by == "judge":  # the others were killed for it
        return _judge_failed(program, verdict)
    if program["status"] in FAILURES:
        return program
    if not handoff.program.result():
        return set_error(
            program,
            "compile_error",
            "program() ran, but the builder left no program "
            f"({PROGRAM_NAME}, a regular file of at most {PROGRAM_CAP // 2**20} MB)",
        )
    if not ran:  # told not to go on: the judge failed first
        return _judge_failed(program, verdict)
    (ran,) = ran
    if not validate or ran["status"] != "pass":
        return ran
    if not verdict or verdict[0]["status"] not in ("pass", "mismatch"):
        return _judge_failed(ran, verdict)
    return _merge_verdict(ran, verdict[0], operator)


def _judge_failed(result: dict, verdict: list[dict]) -> dict:
    reason = "it stopped"
    if verdict:
        reason = (verdict[0].get("error") or {}).get("message") or verdict[0]["status"]
    failed = set_error(dict(result), "infra_error", "the judge failed: " + reason)
    failed["error"]["signature"] = error_signature(failed["error"]["message"])
    return failed


def copy_child_file(
    base: str,
    names: tuple[str, ...],
    dest: Path,
    *,
    size: int | None = None,
    cap: int | None = None,
) -> bool:
    """Copy what a sandboxed child left at ``base/names...`` (``base`` is
    the supervisor's, what is below it the child's): only a regular file,
    reached through no link, FIFO or device the child could have put on the
    way, of exactly ``size`` bytes or at most ``cap``. False, and nothing
    at ``dest``, when there is none."""
    try:
        fd = _open_below(base, names)
    except OSError:
        return False
    with os.fdopen(fd, "rb") as stream:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return False
        if (size is not None and info.st_size != size) or (
            cap is not None and info.st_size > cap
        ):
            return False
        copied = 0
        with open(dest, "wb") as out:
            while chunk := stream.read(min(2**24, info.st_size + 1 - copied)):
                copied += len(chunk)
                out.write(chunk)
    if copied != info.st_size:  # it changed under us
        dest.unlink()
        return False
    os.chmod(dest, 0o644)
    return True


def _open_below(base: str, names: tuple[str, ...]) -> int:
    fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for name in names[:-1]:
            inner = os.open(
                name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd
            )
            os.close(fd)
            fd = inner
        return os.open(
            names[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fd
        )
    finally:
        os.close(fd)


def _merge_verdict(ran: dict, verdict: dict, operator) -> dict:
    """The executor's evidence (compile, kernel time) with the judge's
    verdict and reference time."""
    result = dict(ran)
    result["status"] = verdict["status"]
    result["error"] = verdict["error"]
    result["metrics"] = verdict["metrics"]
    result["tolerance"] = verdict["tolerance"]
    timings = dict(ran["timings"])
    kernel_ms = timings["kernel_ms"]
    if result["status"] != "pass" or not kernel_ms:
        timings["kernel_ms"] = None
    else:
        reference_ms = verdict["timings"]["reference_ms"]
        timings["reference_ms"] = reference_ms
        timings["speedup"] = reference_ms / kernel_ms if reference_ms else None
        timings.update(
            timing.throughput(
                flops=operator.flops(ran["shape"]),
                bytes_moved=operator.bytes_moved(ran["shape"], ran["dtype"]),
                kernel_ms=kernel_ms,
            )
        )
    result["timings"] = timings
    return result


def _account(result: dict, since: float) -> dict:
    """The whole job's wall time, every child of it included."""
    timings = result["timings"]
    timings["wall_s"] = time.perf_counter() - since
    spent = (timings.get("compile_s") or 0.0) + (timings.get("run_s") or 0.0)
    timings["overhead_s"] = max(0.0, timings["wall_s"] - spent)
    return result


def _run_child(
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
) -> list[dict]:
    """Run ``jobs`` in one child until they are done or the child dies or
    hangs. Returns the results of the jobs it finished and, if it failed,
    the failure of the job it was on; nothing when ``on_waiting`` (asked
    when the child waits to go on) said no.

    The child's HOME is ``BASE/home``; BASE itself stays the supervisor's, so
    the child cannot swap the directory that ``collect(BASE)`` reads after it
    is gone. ``mounts`` are host paths the child sees besides its own.
    """
    base = tempfile.mkdtemp(prefix="tm-harness-")
    os.chmod(base, 0o755)
    home = os.path.join(base, "home")
    os.mkdir(home, 0o700)
    spawned = time.perf_counter()
    shared_cache = cache_dir is not None and mode == "library"
    identity = isolation.library() if shared_cache else isolation.acquire()
    try:
        cache = (
            os.path.abspath(cache_dir)
            if shared_cache
            else os.path.join(home, "tilelang-cache")
        )
        timeouts = [job["timeout_s"] or timeout_s for job in jobs]
        limits = Limits(cpu_s=math.ceil(2 * (STARTUP_TIMEOUT_S + sum(timeouts))))
        if any(job["target"]["kind"] != "c" for job in jobs):
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
            **(extra or {}),
        }
        spec_path = Path(base, "spec.json")
        spec_path.write_text(json.dumps(spec))
        env = child_environment(
            home, identity.cache_path(cache) if shared_cache else cache
        )
        if shared_cache:
            env[DEVICE_LOCK_ENV] = os.path.join(
                env["TILELANG_CACHE_DIR"], "tilematrix-device.lock"
            )
            _own_cache(cache, identity)
        identity.give(home)
        # The builder only calls program(): no toolkit, no GPU.
        kinds = set() if mode == "builder" else {j["target"]["kind"] for j in jobs}
        child = _Child(
            interpreter,
            spec_path,
            env,
            identity,
            child_mounts(
                interpreter,
                home=home,
                spec=str(spec_path),
                trusted=mode not in UNTRUSTED_MODES,
                kinds=kinds,
                extra=mounts,
                cache=cache if shared_cache else None,
            ),
            mode=mode,
            interactive=on_waiting is not None,
        )
        if on_start is not None:
            on_start(child)
        try:
            # The child's sandbox and kernel cache are this run's or this
            # host's own: a path in them is named by its file only.
            private = (base, cache, env["TILELANG_CACHE_DIR"])
            results = _supervise(child, jobs, timeouts, spawned, private, on_waiting)
        finally:
            child.kill()
            identity.kill_all()
            if collect is not None:
                collect(base)
        for result in results:
            result["sandbox"] = identity.confinement.describe()
        return results
    finally:
        identity.release()
        shutil.rmtree(base, ignore_errors=True)


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


def _supervise(child, jobs, timeouts, spawned, private, on_waiting) -> list[dict]:
    results: list[dict] = []
    toolchain = None
    current, stage, waited = None, None, False
    mark = spawned
    deadline = spawned + STARTUP_TIMEOUT_S
    while True:
        message = child.next_message(deadline)
        if message is None or message == "eof":
            break
        event = message.get("event")
        if event == "ready" and toolchain is None:
            toolchain = message.get("fingerprint")
        elif event == "start" and toolchain and current is None:
            if message.get("index") != len(results):
                child.notes.append("the harness child started jobs out of order")
                break
            current, stage = len(results), None
            deadline = time.perf_counter() + timeouts[current]
        elif event == "stage" and current is not None:
            stage = message.get("stage") if message.get("stage") in STAGES else stage
        elif event == "waiting" and current is not None and on_waiting and not waited:
            waited = True
            if not on_waiting():
                return results
            child.go()
            deadline = time.perf_counter() + timeouts[current]
        elif event == "result" and current is not None:
            accepted = _accept(message.get("result"), jobs[current], toolchain, child)
            # What a builder leaves counts once it has exited, not when
            # something in it claimed to be done.
            if child.mode == "builder" and not child.wait_exit(deadline):
                text = f"the builder did not exit within {timeouts[current]:g}s"
                accepted = _failed(jobs[current], "timeout", text, stage, toolchain)
            results.append(_finish(accepted, mark, private))
            _progress(results[-1], time.perf_counter() - mark)
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
        return [
            _finish(_failed(j, "infra_error", text, None, None), mark, private)
            for j in jobs
        ]
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
    elif child.cpu_limit_hit():
        status, text = "timeout", "the CPU time limit was reached"
    else:
        status = "runtime_error"
        text = "the kernel process died: " + child.describe_exit()
    failed = _failed(job, status, text, stage, toolchain)
    return results + [_finish(failed, mark, private)]


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


def _accept(result: object, job: dict, toolchain: dict, child: _Child) -> dict:
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


def _finish(result: dict, since: float, private: tuple[str, ...]) -> dict:
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


class _Child:
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
    ):
        self.mode = mode
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
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                return None
            for key, _ in self.selector.select(timeout=remaining):
                chunk = os.read(key.fileobj.fileno(), 65536)
                if not chunk:
                    self.selector.unregister(key.fileobj)
                    self.open_streams -= 1
                elif key.data == "protocol":
                    self.line += chunk
                else:
                    self._keep_output(chunk)

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
