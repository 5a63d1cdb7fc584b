"""The sandboxed child: ``python -m runners.harness.child SPEC.json``.

Started by ``sandbox`` in its own process group and namespaces with a
scrubbed environment, in one of four modes (see ``_runner``).
It speaks JSON lines on its original stdout (the protocol) and sends every
other write, the kernel's and the compiler's included, to stderr, so nothing
a kernel prints can be mistaken for a result:

    {"event": "ready", "fingerprint": {...}}
    {"event": "start", "index": i}
    {"event": "stage", "index": i, "stage": "lower" | "build" | "validate"}
        (an executor's "validate" also carries the ``kernel_source`` it built,
        sent before the kernel first runs)
    {"event": "waiting", "index": i}    (executor and judge: until "go" on stdin)
    {"event": "result", "index": i, "result": {...}}
    {"event": "broken", "message": "..."}   (the toolchain cannot start)

After a runtime error it exits, so that the next job gets a fresh process
(a CUDA context that saw an illegal address is unusable). A warm library
child (``"persistent"`` in its spec, see ``warm``) then reads its next
batch as one line ``{"jobs": [...]}`` on stdin, and ends when stdin closes.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import traceback
from pathlib import Path

# Modes whose process runs submitted code: Python (builder) or the kernel's
# native code (executor).
UNTRUSTED_MODES = ("builder", "executor")
_LIMITS = {
    "cpu_s": resource.RLIMIT_CPU,
    "file_bytes": resource.RLIMIT_FSIZE,
    "processes": resource.RLIMIT_NPROC,
    "core_bytes": resource.RLIMIT_CORE,
}


def apply_limits(limits: dict) -> None:
    """Lower soft and hard limits together, so kernel code cannot raise them
    again; a limit is never raised above what the parent already had."""
    for name, which in _LIMITS.items():
        _lower(which, limits[name])


def limit_memory(limits: dict) -> None:
    """Cap virtual memory at what the imported toolchain maps plus
    ``address_space_extra_bytes``; where that is None (a GPU target), cap
    writable private memory at what it holds plus ``data_extra_bytes``.
    Applied after the imports, before any kernel code."""
    extra = limits["address_space_extra_bytes"]
    which, field = (
        (resource.RLIMIT_AS, "VmSize:")
        if extra is not None
        else (resource.RLIMIT_DATA, "VmData:")
    )
    try:
        status = Path("/proc/self/status").read_text()
        held_kb = int(status.split(field)[1].split()[0])
    except (OSError, IndexError, ValueError):
        return  # no procfs: the other limits still hold
    _lower(
        which,
        held_kb * 1024 + (extra if extra is not None else limits["data_extra_bytes"]),
    )


def _lower(which: int, value: int | None) -> None:
    if value is None:
        return
    _, hard = resource.getrlimit(which)
    value = value if hard == resource.RLIM_INFINITY else min(value, hard)
    resource.setrlimit(which, (value, value))


def main(argv: list[str]) -> int:
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)

    def send(message: dict) -> None:
        protocol.write(json.dumps(message) + "\n")
        protocol.flush()

    spec = json.loads(Path(argv[1]).read_text())
    apply_limits(spec["limits"])
    mode = spec.get("mode", "library")
    try:
        if mode != "judge":
            import tilelang  # noqa: F401  (fail here, not inside the first job)
        import torch  # noqa: F401

        from runners.harness.fingerprint import fingerprint

        run = _runner(mode, spec)
        toolchain = fingerprint(os.environ.get("TILELANG_CACHE_DIR"))
    except Exception:
        send({"event": "broken", "message": traceback.format_exc(limit=-4)})
        return 1
    limit_memory(spec["limits"])
    send({"event": "ready", "fingerprint": toolchain})

    jobs = spec["jobs"]
    while True:
        if not _run_jobs(jobs, run, toolchain, mode, send):
            return 0  # a runtime error: the next job gets a fresh process
        # A warm child (see warm.py) takes its next jobs on stdin, or ends
        # when its supervisor closes it.
        jobs = _next_jobs() if spec.get("persistent") else None
        if jobs is None:
            return 0


def _next_jobs() -> list | None:
    line = sys.stdin.readline()
    if not line:
        return None
    try:
        jobs = json.loads(line)["jobs"]
    except (ValueError, KeyError, TypeError):
        return None
    return jobs if isinstance(jobs, list) else None


def _run_jobs(jobs: list, run, toolchain: dict, mode: str, send) -> bool:
    """Run ``jobs``, each result sent as it ends; False after a runtime
    error (the process should end)."""
    for index, job in enumerate(jobs):
        send({"event": "start", "index": index})

        def wait_for_go(i=index) -> bool:
            send({"event": "waiting", "index": i})
            return sys.stdin.readline().strip() == "go"

        try:
            result = run(
                job,
                fingerprint=toolchain,
                workdir=os.getcwd(),
                on_stage=lambda stage, i=index, **said: send(
                    {"event": "stage", "index": i, "stage": stage, **said}
                ),
                wait_for_go=wait_for_go,
            )
        except Exception:
            result = _harness_failure(job, toolchain, mode)
        send({"event": "result", "index": index, "result": result})
        if result["status"] == "runtime_error":
            return False
    return True


def _runner(mode: str, spec: dict):
    """The function that runs one job in this child's mode: ``library``
    (trusted operator kernels, verdict included), or for a submitted kernel
    ``builder`` (import it, write its PrimFunc), ``executor`` (compile that
    and run it) or ``judge`` (inputs, reference and verdict); see
    ``submitted``."""
    if mode == "library":
        from runners.harness.stages import run_stages

        return lambda job, *, wait_for_go, **kw: run_stages(job, **kw)
    from runners.harness import submitted

    if mode == "builder":
        return lambda job, *, wait_for_go, **kw: submitted.build(job, **kw)
    if mode == "executor":
        return lambda job, **kw: submitted.execute(job, spec=spec, **kw)
    if mode == "judge":
        return lambda job, **kw: submitted.judge(job, spec=spec, **kw)
    raise ValueError(f"unknown harness mode {mode!r}")


def _harness_failure(job: dict, toolchain: dict, mode: str) -> dict:
    from runners.harness.result import new_result, set_error

    result = new_result(job)
    result["fingerprint"] = toolchain
    # Next to submitted code, an exception the harness did not expect is
    # most likely that code's doing: not an infrastructure error to retry.
    status = "runtime_error" if mode in UNTRUSTED_MODES else "infra_error"
    return set_error(result, status, "harness failure:\n" + traceback.format_exc())


def exit_now(code: int) -> None:
    """End the process without finalizing the interpreter: unloading torch
    and TileLang took 0.5-0.7 s of CPU on a 2-core host, and a builder's
    program counts only once its process has exited, so every submitted
    kernel's executor waited that long. What the child says is flushed
    line by line and what it wrote is closed; the exit hooks skipped are
    the toolchain's (temp directories under a HOME the supervisor removes)
    or submitted code's."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


if __name__ == "__main__":
    exit_now(main(sys.argv))
