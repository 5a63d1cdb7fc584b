"""Run jobs in sandboxed children and turn whatever happens into results.

Each child gets its own process group (killed whole on timeout), an
environment built from an allow-list, a temporary HOME removed afterwards,
resource limits, a TileLang kernel cache per toolchain (a throwaway one for
submitted kernels) and a 16 KB cap on what it prints. Where the supervisor is
root, each child also runs under a uid of its own in an empty network
namespace (see ``isolation``). Trusted library jobs of one toolchain share a
child, one job after another; a child that crashes or hangs costs only its
current job, and the rest continue in a fresh one.

A submitted kernel is run by two children: an untrusted one that compiles it
and writes its outputs for two input sets, and a judge that imports no
submitted code and decides pass or mismatch (see ``untrusted``).
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
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from runners.harness import isolation, tensors, timing
from runners.harness.job import lookup_operator, parse_job
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
)
from runners.harness.sanitize import error_signature, sanitize
from runners.harness.stages import DEVICE_LOCK_ENV

log = logging.getLogger(__name__)

REPO_ROOT = str(Path(__file__).resolve().parents[2])
DEFAULT_TIMEOUT_S = 300.0
STARTUP_TIMEOUT_S = 180.0
OUTPUT_CAP = 16 * 1024
PROTOCOL_LINE_CAP = 1024 * 1024
CRASH_TAIL = 2048

# Passed through to the child when set, and nothing else.
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
    "TVM_LIBRARY_PATH",
    "TVM_NUM_THREADS",
    "TL_TEMPLATE_PATH",
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


# Called with (index of the job in what was asked, its result) as each job
# ends, from the thread supervising its child.
OnResult = Callable[[int, dict], None]


def run_batch(
    jobs: Iterable[dict],
    *,
    interpreter: str = sys.executable,
    cache_dir: str,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    trusted: bool = True,
    workers: int = 1,
    on_result: OnResult | None = None,
) -> list[dict]:
    """Run jobs of one toolchain; results come back in the jobs' order.

    Trusted library jobs share children (``workers`` of them at a time, each
    taking every ``workers``-th job); a job with submitted source, or any job
    when ``trusted`` is false, gets a child and a kernel cache of its own.
    ``timeout_s`` applies to each job that does not name its own.
    ``on_result(index, result)``, when given, hears of each job as soon as it
    ends, while the others still run (from several threads at once).
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

        def ended(k: int, result: dict) -> None:
            if on_result is not None:
                on_result(indices[k], result)

        if group_jobs[0]["source"] is not None:
            (job,) = group_jobs
            result = _run_submitted(job, interpreter=interpreter, timeout_s=timeout_s)
            ended(0, result)
            return [result]
        return _run_group(
            group_jobs,
            interpreter=interpreter,
            cache_dir=cache,
            timeout_s=timeout_s,
            on_result=ended,
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
    jobs: list[dict],
    *,
    interpreter: str,
    cache_dir: str | None,
    timeout_s: float,
    on_result: OnResult,
) -> list[dict]:
    results: list[dict] = []
    while len(results) < len(jobs):
        done = len(results)
        results += _run_child(
            jobs[done:],
            interpreter=interpreter,
            cache_dir=cache_dir,
            timeout_s=timeout_s,
            on_result=lambda k, result, done=done: on_result(done + k, result),
        )
    return results


def _run_submitted(job: dict, *, interpreter: str, timeout_s: float) -> dict:
    """Compile and run a submitted kernel in an untrusted child, then let a
    judge child compare what it wrote with the reference."""
    from runners.kernels.base import Unsupported

    operator = lookup_operator(job["operator"])
    shape, dtype = job["shape"], job["dtype"]
    try:
        operator.check(shape, dtype, job["target"])
        unsupported = None
    except Unsupported as exc:
        unsupported = str(exc)
    out_specs = [tensors.spec_dict(s) for s in operator.outputs(shape, dtype)]
    # The second seed is drawn here, so nothing can be prepared for it.
    seeds = [job["seed"], secrets.randbelow(2**63)]
    staging = tempfile.mkdtemp(prefix="tm-outputs-")
    try:
        (ran,) = _run_child(
            [job],
            interpreter=interpreter,
            cache_dir=None,
            timeout_s=timeout_s,
            mode="untrusted",
            extra={
                "seeds": seeds,
                "inputs": [tensors.spec_dict(s) for s in operator.inputs(shape, dtype)],
                "outputs": out_specs,
                "unsupported": unsupported,
            },
            collect=lambda base: _collect_outputs(base, staging, out_specs, len(seeds)),
        )
        if job["stage"] != "validate" or ran["status"] != "pass":
            return ran
        (verdict,) = _run_child(
            [job],
            interpreter=interpreter,
            cache_dir=None,
            timeout_s=timeout_s,
            mode="judge",
            extra={"seeds": seeds},
            stage_in=staging,
        )
        return _merge_verdict(ran, verdict, operator)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _collect_outputs(base: str, staging: str, specs: list[dict], sets: int) -> None:
    """Copy the outputs the untrusted child wrote, as regular files of the
    exact expected size, without following anything it could have swapped
    for a link, a FIFO or a device."""
    try:
        out_fd = os.open(
            os.path.join(base, "home", "out"),
            os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW,
        )
    except OSError:
        return
    try:
        for input_set in range(sets):
            for index, spec in enumerate(specs):
                name = tensors.output_name(input_set, index)
                data = _read_regular(out_fd, name, tensors.byte_size(spec))
                if data is not None:
                    Path(staging, name).write_bytes(data)
    finally:
        os.close(out_fd)


def _read_regular(dir_fd: int, name: str, size: int) -> bytes | None:
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
    try:
        fd = os.open(name, flags, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size != size:
            return None
        with os.fdopen(os.dup(fd), "rb") as stream:
            data = stream.read(size + 1)
        return data if len(data) == size else None
    finally:
        os.close(fd)


def _merge_verdict(ran: dict, verdict: dict, operator) -> dict:
    """The untrusted child's compile evidence with the judge's verdict."""
    result = dict(ran)
    timings = dict(ran["timings"])
    result["timing_trust"] = (
        "advisory: kernel_ms was measured inside the untrusted child"
    )
    if verdict["status"] not in ("pass", "mismatch"):
        message = (verdict.get("error") or {}).get("message") or verdict["status"]
        failed = set_error(result, "infra_error", "the judge failed: " + message)
        failed["error"]["signature"] = error_signature(failed["error"]["message"])
        return failed
    result["status"] = verdict["status"]
    result["error"] = verdict["error"]
    result["metrics"] = verdict["metrics"]
    result["tolerance"] = verdict["tolerance"]
    timings["wall_s"] += verdict["timings"]["wall_s"] or 0.0
    timings["run_s"] = (timings["run_s"] or 0.0) + (verdict["timings"]["run_s"] or 0.0)
    timings["overhead_s"] = max(
        0.0, timings["wall_s"] - (timings["compile_s"] or 0.0) - timings["run_s"]
    )
    kernel_ms = timings["kernel_ms"]
    reference_ms = verdict["timings"]["reference_ms"]
    if result["status"] != "pass" or not kernel_ms:
        timings["kernel_ms"] = None
    else:
        timings["reference_ms"] = reference_ms
        timings["speedup"] = reference_ms / kernel_ms if reference_ms else None
        shape, dtype = ran["shape"], ran["dtype"]
        timings.update(
            timing.throughput(
                flops=operator.flops(shape),
                bytes_moved=operator.bytes_moved(shape, dtype),
                kernel_ms=kernel_ms,
            )
        )
    result["timings"] = timings
    return result


def _run_child(
    jobs: list[dict],
    *,
    interpreter: str,
    cache_dir: str | None,
    timeout_s: float,
    mode: str = "library",
    extra: dict | None = None,
    collect=None,
    stage_in: str | None = None,
    on_result: OnResult | None = None,
) -> list[dict]:
    """Run ``jobs`` in one child until they are done or the child dies or
    hangs. Returns at least one result: the jobs it finished and, if it failed,
    the failure of the job it was on; ``on_result`` hears of each as it ends.

    The child's HOME is ``BASE/home``; BASE itself stays the supervisor's, so
    the child cannot swap the directory that ``collect(BASE)`` reads after it
    is gone. ``stage_in`` is copied to ``BASE/inbox`` for the child to read.
    """
    base = tempfile.mkdtemp(prefix="tm-harness-")
    os.chmod(base, 0o755)
    home = os.path.join(base, "home")
    os.mkdir(home, 0o700)
    spawned = time.perf_counter()
    shared_cache = cache_dir is not None and mode == "library"
    identity = isolation.library() if shared_cache else isolation.acquire()
    try:
        # Absolute: the child may bind it into a mount namespace of its own.
        cache = (
            os.path.abspath(cache_dir)
            if shared_cache
            else os.path.join(home, "tilelang-cache")
        )
        timeouts = [job["timeout_s"] or timeout_s for job in jobs]
        limits = Limits(cpu_s=math.ceil(2 * (STARTUP_TIMEOUT_S + sum(timeouts))))
        if any(job["target"]["kind"] != "c" for job in jobs):
            limits = replace(limits, address_space_extra_bytes=None)
        if mode == "untrusted":
            limits = untrusted_limits(limits)
        spec = {"jobs": jobs, "limits": asdict(limits), "mode": mode, **(extra or {})}
        if stage_in is not None:
            inbox = os.path.join(base, "inbox")
            shutil.copytree(stage_in, inbox)
            os.chmod(inbox, 0o755)
            for name in os.listdir(inbox):
                os.chmod(os.path.join(inbox, name), 0o644)
            spec["outputs_dir"] = inbox
        spec_path = Path(base, "spec.json")
        spec_path.write_text(json.dumps(spec))
        env = child_environment(
            home, identity.cache_path(cache) if shared_cache else cache
        )
        if shared_cache:
            env[DEVICE_LOCK_ENV] = os.path.join(
                env["TILELANG_CACHE_DIR"], "tilematrix-device.lock"
            )
        if shared_cache:
            _own_cache(cache, identity)
        identity.give(home)
        child = _Child(
            interpreter,
            spec_path,
            home,
            env,
            identity,
            untrusted=mode == "untrusted",
            cache=cache if shared_cache else None,
        )
        try:
            # The child's sandbox and kernel cache are this run's or this
            # host's own: a path in them is named by its file only.
            private = (base, cache, env["TILELANG_CACHE_DIR"])
            return _supervise(child, jobs, timeouts, spawned, private, on_result)
        finally:
            child.kill()
            identity.kill_all()
            if collect is not None:
                collect(base)
    finally:
        identity.release()
        shutil.rmtree(base, ignore_errors=True)


def _own_cache(cache: str, identity: isolation.Identity) -> None:
    """Give a shared kernel cache to the library children's uid, once."""
    os.makedirs(cache, exist_ok=True)
    if identity.uid is not None and os.stat(cache).st_uid != identity.uid:
        identity.give(cache)


def _supervise(child, jobs, timeouts, spawned, private, on_result) -> list[dict]:
    results: list[dict] = []

    def ended(result: dict) -> None:
        results.append(result)
        if on_result is not None:
            on_result(len(results) - 1, result)

    toolchain = None
    current, stage = None, None
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
        elif event == "result" and current is not None:
            accepted = _accept(
                message.get("result"), jobs[current], toolchain, child.untrusted
            )
            finished = _finish(accepted, mark, private)
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
            ended(_finish(_failed(job, "infra_error", text, None, None), mark, private))
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
    elif child.cpu_limit_hit():
        status, text = "timeout", "the CPU time limit was reached"
    else:
        status = "runtime_error"
        text = "the kernel process died: " + child.describe_exit()
    ended(_finish(_failed(job, status, text, stage, toolchain), mark, private))
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


def _accept(result: object, job: dict, toolchain: dict, untrusted: bool) -> dict:
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
        status = "runtime_error" if untrusted else "infra_error"
        return _failed(job, status, text, None, toolchain)
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
        home: str,
        env: dict,
        identity: isolation.Identity,
        *,
        untrusted: bool,
        cache: str | None,
    ):
        self.untrusted = untrusted
        # -P: the child's own cwd (its HOME) never shadows the harness.
        argv = [
            os.path.abspath(interpreter) if os.sep in interpreter else interpreter,
            "-P",
            "-m",
            "runners.harness.child",
            str(spec),
        ]
        self.proc = subprocess.Popen(
            identity.command(argv, cache=cache),
            cwd=home,
            env=env,
            stdin=subprocess.DEVNULL,
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

    def _keep_output(self, chunk: bytes) -> None:
        # Keep the tail: a crash explains itself last.
        self.output_total += len(chunk)
        self.output += chunk
        del self.output[: max(0, len(self.output) - OUTPUT_CAP)]

    def kill(self) -> None:
        """Kill the whole process group, the compilers it started included,
        then reap the child."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()
        for stream in (self.proc.stdout, self.proc.stderr):
            stream.close()
        self.selector.close()

    def cpu_limit_hit(self) -> bool:
        return self.proc.returncode == -signal.SIGXCPU

    def describe_exit(self) -> str:
        code = self.proc.poll()
        if code is None:
            self.proc.wait()
            code = self.proc.returncode
        if code < 0:
            how = f"killed by {signal.Signals(-code).name}"
        else:
            how = f"exit status {code}"
        tail = "\n".join(self.notes) or self.output[-CRASH_TAIL:].decode(
            errors="replace"
        )
        return f"{how}\n{tail}".rstrip()
