"""Run jobs in sandboxed children (see ``children``) and return one result
per job.

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

import os
import secrets
import shutil
import stat
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path

from runners.harness import compare, distributions, isolation, tensors, timing
from runners.harness.children import Child, OnResult, finish, run_child
from runners.harness.job import lookup_operator, parse_job
from runners.harness.result import FAILURES, new_result, set_error
from runners.harness.sanitize import error_signature
from runners.harness.submitted import PROGRAM_CAP, PROGRAM_NAME

DEFAULT_TIMEOUT_S = 300.0


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


COMPILE_WORKERS_ENV = "TILEMATRIX_COMPILE_WORKERS"


def compile_workers() -> int:
    """Children compiling side by side: the host's cores, up to 16 (each child
    holds torch and TileLang, about 1.5 GB)."""
    return int(os.environ.get(COMPILE_WORKERS_ENV) or min(16, os.cpu_count() or 1))


def run_batch(
    jobs: Iterable[dict],
    *,
    interpreter: str = sys.executable,
    cache_dir: str,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    trusted: bool = True,
    workers: int = 1,
    on_result: OnResult | None = None,
    keep_warm: bool = False,
) -> list[dict]:
    """Run jobs of one toolchain; results come back in the jobs' order.

    Trusted library jobs share children (``workers`` of them at a time, each
    taking every ``workers``-th job); a job with submitted source, or any job
    when ``trusted`` is false, gets a child and a kernel cache of its own.
    ``timeout_s`` applies to each job that does not name its own.
    ``on_result(index, result)``, when given, hears of each job as soon as it
    ends, while the others still run (from several threads at once).
    With ``keep_warm`` the library children stay for the next batch (see
    ``warm``), as a runner's worker runs one message after another.
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
            keep_warm=keep_warm,
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
    keep_warm: bool = False,
) -> list[dict]:
    results: list[dict] = []
    while len(results) < len(jobs):
        done = len(results)
        results += run_child(
            jobs[done:],
            interpreter=interpreter,
            cache_dir=cache_dir,
            timeout_s=timeout_s,
            on_result=lambda k, result, done=done: on_result(done + k, result),
            keep_warm=keep_warm,
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
        return finish(refused, started, ())
    operator = lookup_operator(job["operator"])
    shape, dtype = job["shape"], job["dtype"]
    try:
        operator.check(shape, dtype, job["target"])
    except Unsupported as exc:
        (result,) = run_child(
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
        self._children: list[Child] = []
        self._lock = threading.Lock()

    @staticmethod
    def settle(future: Future, value: bool) -> None:
        if not future.done():
            future.set_result(value)

    def started(self, child: Child) -> None:
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
    # The second seed is drawn here, so nothing can be prepared for it; the
    # operator's other input distributions are drawn from it too.
    second = secrets.randbelow(2**63)
    input_sets = [
        {
            "seed": job["seed"],
            "distribution": tensors.distribution_dict(tensors.UNIFORM),
        },
        {"seed": second, "distribution": tensors.distribution_dict(tensors.UNIFORM)},
    ] + [
        {"seed": second, "distribution": tensors.distribution_dict(d)}
        for d in distributions.checked_on(job["operator"])[1:]
    ]
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
            results = run_child(
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
            written = [
                tensors.run_set(input_set, run)
                for input_set in range(len(input_sets))
                for run in range(compare.VALIDATION_RUNS)
            ]
            for input_set in [*written, tensors.TIMED_SET]:
                for index, spec in enumerate(out_specs):
                    name = tensors.output_name(input_set, index)
                    copy_child_file(
                        base,
                        ("home", "out", name),
                        outputs_dir / name,
                        size=tensors.byte_size(spec),
                    )

        try:
            results = run_child(
                **run,
                mode="executor",
                extra={
                    "program": str(program_dir / PROGRAM_NAME),
                    "inputs": in_specs,
                    "outputs": out_specs,
                    "inputs_dir": str(inputs_dir),
                    "input_sets": len(input_sets),
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
            return run_child(
                **run,
                mode="judge",
                extra={
                    "input_sets": input_sets,
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
    if not verdict or verdict[0]["status"] not in ("pass", "mismatch", "unstable"):
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
    result["distributions"] = verdict.get("distributions")
    timings = dict(ran["timings"])
    kernel_ms = timings["kernel_ms"]
    if result["status"] != "pass" or not kernel_ms:
        timings["kernel_ms"] = None
        result["timing_samples"] = None
    else:
        result["timing_samples"] = {
            **(ran.get("timing_samples") or {}),
            **(verdict.get("timing_samples") or {}),
        }
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
