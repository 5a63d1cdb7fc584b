"""The runner host's side: its key directory, its inventory, and running one
signed job through the sandboxed harness.

A runner host keeps in its key directory ``runner.key`` (Ed25519, mode 0600,
never sent) and ``runner.json`` (its name, its queues, the server's public
key, and the interpreter of each toolchain it hosts), written at
registration.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import logging
import os
import platform
import queue
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from runners import client, disk, kernel_cache, protocol, signing
from runners import config as agent_config
from runners.harness import isolation
from runners.harness.fingerprint import matrix_fingerprint
from runners.harness.sandbox import COMPILE_WORKERS_ENV, compile_workers
from runners.kernels.revision import library_sha256

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parent.parent
RUNNER_DIR_ENV = "TILEMATRIX_RUNNER_DIR"
HARNESS_ENV = "TILEMATRIX_HARNESS"
DEFAULT_HARNESS = "runners.harness.sandbox"
INFRA_RETRIES = 3
INFRA_BACKOFF_S = 2.0
PROBE_TIMEOUT_S = 120


class HostError(RuntimeError):
    """The host cannot act as a runner; the message says what to fix."""


class RunnerPaused(Exception):
    """The server gives this runner no work for now (its health, such as
    ``maintenance``, is the message)."""


class RunnerShortOfDisk(Exception):
    """This host has too little disk to run a job now; the message says
    where and how much."""


def runner_dir(explicit: str | os.PathLike | None = None) -> Path:
    return Path(
        explicit or os.environ.get(RUNNER_DIR_ENV) or agent_config.var_dir() / "runner"
    )


@dataclass
class HostConfig:
    directory: Path
    name: str
    server: str
    server_public_key: str
    queues: list[str]
    toolchains: dict  # server fingerprint -> {"interpreter", "name", "id"}

    @property
    def key(self):
        return signing.key_read(self.directory / "runner.key")

    @classmethod
    def load(cls, directory: Path) -> HostConfig:
        path = directory / "runner.json"
        if not path.exists():
            raise HostError(
                f"{path} does not exist: register first with "
                "`tilematrix-runner register --server URL --token TOKEN --name NAME`"
            )
        data = json.loads(path.read_text())
        return cls(directory=directory, **data)

    def save(self) -> None:
        data = {
            "name": self.name,
            "server": self.server,
            "server_public_key": self.server_public_key,
            "queues": self.queues,
            "toolchains": self.toolchains,
        }
        (self.directory / "runner.json").write_text(json.dumps(data, indent=2) + "\n")


# Inventory --------------------------------------------------------------


def _run(argv: list[str], timeout: float = 20) -> str | None:
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout


def _nvidia_devices() -> list[dict]:
    if not shutil.which("nvidia-smi"):
        return []
    out = _run(
        [
            "nvidia-smi",
            "--query-gpu=name,memory.total,compute_cap",
            "--format=csv,noheader,nounits",
        ]
    )
    devices = []
    for line in (out or "").splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 3:
            continue
        name, memory_mib, cap = parts
        model = name.removeprefix("NVIDIA ").strip()
        arch = "sm_" + cap.replace(".", "")
        # Hopper kernels use the arch-specific features of sm_90a.
        arch = "sm_90a" if arch == "sm_90" else arch
        memory = (
            int(float(memory_mib) / 1024)
            if memory_mib.replace(".", "").isdigit()
            else None
        )
        devices.append(
            {
                "vendor": "NVIDIA",
                "model": model,
                "arch": arch,
                "backend": "cuda",
                "memory_gb": memory,
            }
        )
    return devices


def _rocm_devices() -> list[dict]:
    if not shutil.which("rocm-smi"):
        return []
    out = _run(["rocm-smi", "--showproductname", "--json"])
    try:
        cards = json.loads(out or "{}")
    except ValueError:
        return []
    devices = []
    for card in cards.values():
        if not isinstance(card, dict):
            continue
        model = card.get("Card series") or card.get("Card SKU") or "GPU"
        arch = card.get("GFX Version", "")
        devices.append(
            {
                "vendor": "AMD",
                "model": model,
                "arch": arch,
                "backend": "hip",
                "memory_gb": None,
            }
        )
    return devices


def _torch_devices(interpreter: str) -> list[dict]:
    """GPUs torch sees when no vendor tool is installed (a container with
    only the driver libraries)."""
    code = (
        "import json, torch\n"
        "out = []\n"
        "if torch.cuda.is_available():\n"
        "    for i in range(torch.cuda.device_count()):\n"
        "        p = torch.cuda.get_device_properties(i)\n"
        "        out.append([p.name, p.major, p.minor, p.total_memory])\n"
        "print(json.dumps(out))\n"
    )
    out = _run([interpreter, "-c", code], timeout=PROBE_TIMEOUT_S)
    try:
        found = json.loads((out or "[]").strip().splitlines()[-1])
    except (ValueError, IndexError):
        return []
    return [
        {
            "vendor": "NVIDIA",
            "model": name.removeprefix("NVIDIA ").strip(),
            "arch": "sm_90a" if (major, minor) == (9, 0) else f"sm_{major}{minor}",
            "backend": "cuda",
            "memory_gb": int(memory / 2**30),
        }
        for name, major, minor, memory in found
    ]


def cpu_device() -> dict:
    machine = platform.machine().lower()
    vendor = "x86-64" if machine in {"x86_64", "amd64"} else machine or "cpu"
    return {
        "vendor": vendor,
        "model": "CPU",
        "arch": "",
        "backend": "c",
        "memory_gb": None,
    }


def toolchain_probe(interpreter: str) -> dict:
    """The toolchain an interpreter provides, fingerprinted by the harness
    inside that interpreter (its packages, not this process's)."""
    code = (
        "import json, sys\n"
        f"sys.path.insert(0, {str(REPO_ROOT)!r})\n"
        "from runners.harness.fingerprint import fingerprint\n"
        "print(json.dumps(fingerprint()))\n"
    )
    out = _run([interpreter, "-c", code], timeout=PROBE_TIMEOUT_S)
    try:
        found = json.loads((out or "").strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise HostError(f"cannot fingerprint the toolchain of {interpreter}") from None
    components = found["components"]
    server_fp = matrix_fingerprint(components)
    return {
        "name": f"tilelang-{components.get('tilelang')}-{server_fp[:8]}",
        "interpreter": interpreter,
        "components": components,
        "fingerprint": found["hash"],
    }


def inventory_probe(interpreters: list[str]) -> dict:
    devices = _nvidia_devices() + _rocm_devices()
    if not devices:
        devices = _torch_devices(interpreters[0])
    devices.append(cpu_device())
    toolchains = [toolchain_probe(i) for i in interpreters]
    return {
        "devices": devices,
        "toolchains": toolchains,
        "nvcc": bool(shutil.which("nvcc"))
        or any(t["components"].get("nvcc") for t in toolchains),
        "host": {"hostname": platform.node(), "python": platform.python_version()},
    }


# Executing a job --------------------------------------------------------


def library_mismatch(job: dict, digests: dict[str, str | None]) -> str | None:
    """Why this host must not run a library job: its copy of the kernel is
    not the revision the server planned. Submitted kernels carry their text.
    ``digests`` keeps this host's revisions over one batch: reading and
    parsing an operator's modules costs milliseconds, once is enough."""
    if not job.get("library", True):
        return None
    operator = str(job.get("operator"))
    if operator not in digests:
        digests[operator] = library_sha256(operator)
    local = digests[operator]
    if local == job.get("source_sha256"):
        return None
    return (
        "this runner's kernel library differs from the job's revision "
        f"(local {str(local)[:12]}, job {str(job.get('source_sha256'))[:12]}): "
        "update the runner's checkout"
    )


def harness_batch():
    """The harness's ``run_batch``; TILEMATRIX_HARNESS names another module
    offering it (tests use an edge double that starts no TileLang)."""
    module = importlib.import_module(os.environ.get(HARNESS_ENV) or DEFAULT_HARNESS)
    return module.run_batch


def infra_result(job: dict, message: str) -> dict:
    return {
        "status": "infra_error",
        "stage_reached": None,
        "error": {
            "signature": hashlib.sha256(message.encode()).hexdigest()[:16],
            "message": message,
        },
        "operator": job.get("operator"),
        "stage": job.get("stage"),
    }


# The fewest jobs a harness child of a parallel batch is given.
JOBS_PER_CHILD = 3
HARNESS_FIELDS = ("operator", "shape", "dtype", "target", "stage", "seed")


def harness_job(job: dict) -> dict:
    out = {k: job[k] for k in HARNESS_FIELDS}
    if not job.get("library", True):
        out["source"], out["source_sha256"] = (
            job.get("source"),
            job.get("source_sha256"),
        )
    return out


def batch_workers(jobs: list[dict]) -> int:
    """Children for one batch. Library kernels for a device compile side by
    side, taking the device in turn to validate and time (the harness's
    device lock), each child on at least JOBS_PER_CHILD of them: a child's
    start (TileLang's import, the device context) costs more than a cached
    kernel's whole job, so 24 jobs on 16 children spent most of a warm
    message starting children. CPU timings, and submitted kernels, get one
    child at a time, so that nothing else runs beside what is being timed."""
    parallel = all(
        job.get("library", True)
        and not (job["target"].get("kind") == "c" and job["stage"] == "validate")
        for job in jobs
    )
    return min(compile_workers(), -(-len(jobs) // JOBS_PER_CHILD)) if parallel else 1


def work_processes() -> int:
    """Messages a host's worker runs at once unless told: on a GPU host,
    half its cores up to 8, so that while one message's children start or
    compile, another's hold the GPU (one at a time, by the device lock);
    elsewhere one, since CPU timings must not share the cores."""
    if not any(isolation.gpu_nodes(kind) for kind in ("cuda", "hip")):
        return 1
    return max(1, min(8, (os.cpu_count() or 1) // 2))


def share_cores(processes: int) -> None:
    """Split the compile workers between a worker's ``processes``, each of
    which runs one message at a time, rather than each starting a child per
    core; a value set for the host stays."""
    os.environ.setdefault(
        COMPILE_WORKERS_ENV, str(max(1, compile_workers() // max(1, processes)))
    )


SUCCESSES = ("pass", "lowered", "built")
# What a full disk makes of a job: a build whose output could not be
# written (TileLang's "Compilation Failed!" does not quote the compiler's
# "No space left on device"), a kernel library that could not be loaded.
DISK_CAUSED = ("compile_error", "runtime_error", "infra_error")


def short_of_disk(job: dict, result: dict, disk_short=None) -> dict:
    """A job that failed because a write found the disk full ends as the
    runner's trouble, an infra_error, never as a verdict on its kernel:
    its error says so, or it failed as a full disk makes jobs fail while
    ``disk_short()`` finds the disk short."""
    if result.get("status") in SUCCESSES:
        return result
    message = (result.get("error") or {}).get("message") or ""
    if disk.says_disk_full(result):
        reason = disk.SHORT_OF_DISK
    elif result.get("status") in DISK_CAUSED and disk_short is not None:
        reason = disk_short()
        if reason is None:
            return result
    else:
        return result
    said = f"; the job ended {result.get('status')}: {message}"
    return infra_result(job, (reason + said)[:2000])


def jobs_run(
    *,
    jobs: list[dict],
    interpreter: str,
    cache_dir: Path,
    timeout_s: float,
    on_result=None,
    make_room=None,
    disk_short=None,
) -> list[dict]:
    """Run jobs of one toolchain in the sandboxed harness, library jobs
    sharing children. Jobs that end in infra_error (the sandbox's trouble,
    never the kernel's, a full disk included: ``short_of_disk``) are run
    again with backoff, after ``make_room()`` where the disk was full; any
    other status is an answer. ``on_result(index, result)`` hears of each job's answer as soon
    as it is one, while the others still run."""
    run_batch = harness_batch()
    results: list[dict | None] = [None] * len(jobs)
    answered: set[int] = set()
    disk_full: list[bool] = []

    def answer(i: int, result: dict) -> None:
        results[i] = result
        answered.add(i)
        if on_result is not None:
            on_result(i, result)

    pending = list(range(len(jobs)))
    for attempt in range(INFRA_RETRIES):
        last = attempt == INFRA_RETRIES - 1
        disk_full.clear()

        def ended(k: int, result: dict, pending=pending, last=last) -> None:
            checked = short_of_disk(jobs[pending[k]], result, disk_short)
            if checked is not result:
                disk_full.append(True)
            if last or checked.get("status") != "infra_error":
                answer(pending[k], checked)

        batch = [jobs[i] for i in pending]
        try:
            results_now = run_batch(
                [harness_job(job) for job in batch],
                interpreter=interpreter,
                cache_dir=str(cache_dir),
                timeout_s=timeout_s,
                workers=batch_workers(batch),
                on_result=ended,
                keep_warm=True,
            )
        except Exception as exc:  # the harness must not take the worker down
            reason = (str(exc).splitlines() or [exc.__class__.__name__])[0][:500]
            if disk.is_disk_full(exc):
                # Its sandbox could not be written: tried again once there
                # may be room.
                log.warning("harness could not start: %s: %s", disk.SHORT_OF_DISK, exc)
                disk_full.append(True)
                if last:
                    for i in pending:
                        if i not in answered:
                            answer(
                                i,
                                infra_result(
                                    jobs[i], f"{disk.SHORT_OF_DISK}: {reason}"
                                ),
                            )
                    break
                results_now = None
            else:
                # A batch the harness refuses is refused again on retry:
                # report it.
                log.exception(
                    "harness refused jobs %s", [jobs[i]["job"] for i in pending]
                )
                for i in pending:
                    if i not in answered:
                        answer(
                            i,
                            infra_result(jobs[i], f"harness refused the job: {reason}"),
                        )
                break
        answers = zip(pending, results_now, strict=True) if results_now else ()
        for i, result in answers:
            result = short_of_disk(jobs[i], result, disk_short)
            results[i] = result
            if i not in answered and (last or result.get("status") != "infra_error"):
                answer(i, result)
        pending = [i for i in pending if i not in answered]
        if not pending:
            break
        if disk_full and make_room is not None:
            make_room()
        time.sleep(INFRA_BACKOFF_S * 2**attempt)
    return results


def jobs_verify(*, envelope, config: HostConfig) -> list[dict]:
    """The jobs of a message the server signed, or EnvelopeError."""
    payload = signing.envelope_verify(envelope, public_key=config.server_public_key)
    if envelope["signer"] != signing.SERVER_SIGNER or payload.get("kind") != "jobs":
        raise signing.EnvelopeError("not a jobs message signed by the server")
    jobs = payload.get("jobs")
    if not isinstance(jobs, list) or not jobs:
        raise signing.EnvelopeError("a jobs message needs a non-empty list of jobs")
    for job in jobs:
        if not isinstance(job, dict) or not all(
            isinstance(job.get(f), int) for f in ("job", "attempt")
        ):
            raise signing.EnvelopeError("each job needs an integer job and attempt")
        missing = [f for f in (*HARNESS_FIELDS, "toolchain") if f not in job]
        if missing:
            raise signing.EnvelopeError(f"job {job['job']} lacks {', '.join(missing)}")
    return jobs


def python_for(config: HostConfig, toolchain_fingerprint: str) -> str | None:
    hosted = config.toolchains.get(toolchain_fingerprint)
    return hosted["interpreter"] if hosted else None


def default_interpreters() -> list[str]:
    return [sys.executable]


def outbox_dir(config: HostConfig) -> Path:
    path = config.directory / "outbox"
    path.mkdir(parents=True, exist_ok=True)
    return path


def outbox_keep(outbox: Path, job: dict, envelope: dict) -> None:
    """Keep a signed result in the outbox, written whole: the worker's main
    process reads the outbox while the job's process writes it."""
    path = outbox / f"{job['job']}-{job['attempt']}.json"
    temporary = outbox / f".{path.name}.{os.getpid()}.tmp"
    temporary.write_text(json.dumps(envelope))
    os.replace(temporary, path)


# How long a job message waits for room to keep the results the outbox
# could not hold, and how often it tries.
OUTBOX_CATCH_UP_S = 120.0
OUTBOX_CATCH_UP_EVERY_S = 5.0


def outbox_catch_up(
    outbox: Path,
    unkept: list[tuple[dict, dict]],
    *,
    make_room,
    wait_s: float = OUTBOX_CATCH_UP_S,
    every_s: float = OUTBOX_CATCH_UP_EVERY_S,
) -> int:
    """Keep in the outbox the results it could not hold when their jobs
    ended, once there is room. They were sent, but only the outbox sends a
    result again should the control worker lose it: without it, its job
    would wait for it until this runner restarts. Tries every ``every_s``
    for up to ``wait_s`` (the message holds its place in the worker
    meanwhile: a runner short of disk has no room for another job either).
    Returns how many could not be kept."""
    deadline = time.monotonic() + wait_s
    while unkept:
        make_room()
        try:
            outbox_keep(outbox, *unkept[0])
        except OSError as exc:
            if time.monotonic() >= deadline:
                log.error(
                    "%d results sent but not kept in the outbox (%s): should the "
                    "control worker lose them, their jobs wait until this "
                    "runner restarts",
                    len(unkept),
                    exc,
                )
                return len(unkept)
            time.sleep(every_s)
            continue
        unkept.pop(0)
    return 0


def results_send(envelopes: list[dict]) -> None:
    """Hand signed results to the control worker in one message, on the
    queue the server gave this runner (``protocol.results_queue``). They stay
    in the outbox until the server says their jobs are no longer waiting
    for them: results a broker or a control worker lost are sent again
    (``outbox_flush``)."""
    protocol.control_send(
        protocol.INGEST_RESULT,
        envelopes,
        queue=protocol.results_queue(),
        compression="zlib",
        argsrepr=f"{len(envelopes)} results",
        kwargsrepr="{}",
        retry=True,
        retry_policy={
            "max_retries": 60,
            "interval_start": 0.5,
            "interval_step": 0.5,
            "interval_max": 5,
        },
    )


# A result is sent within RESULTS_FLUSH_S of its job's end; the results of
# one message that end within that time of the first travel in one control
# message (at most RESULTS_PER_MESSAGE), so fast compile-only jobs do not
# make one message each. The window runs from the first job's end, not from
# when this thread saw it: a send that took long (a busy server, a loaded
# host) must not hold the next result for a later one.
RESULTS_FLUSH_S = 1.0
RESULTS_PER_MESSAGE = 50
RESULTS_POLL_S = 0.1


def results_stream(ended: queue.SimpleQueue, running: Future) -> None:
    """Send the signed results that ``running`` (a message's jobs, run in
    another thread) puts in ``ended`` as (``time.monotonic()`` at the job's
    end, envelope), from this thread, until it is done."""
    carried = None  # a result that ended after the last window closed
    while carried is not None or not (running.done() and ended.empty()):
        if carried is None:
            try:
                carried = ended.get(timeout=RESULTS_POLL_S)
            except queue.Empty:
                continue
        first_end, envelope = carried
        carried = None
        batch = [envelope]
        deadline = first_end + RESULTS_FLUSH_S
        while len(batch) < RESULTS_PER_MESSAGE:
            # Past the deadline, results already waiting that ended inside
            # the window still join it.
            wait = min(RESULTS_POLL_S, deadline - time.monotonic())
            try:
                end, envelope = ended.get(timeout=max(wait, 0.0))
            except queue.Empty:
                if wait <= 0 or running.done():
                    break
                continue
            if end > deadline:
                carried = (end, envelope)
                break
            batch.append(envelope)
        try:
            results_send(batch)
        except Exception as exc:  # the broker is away past the send's retries
            log.warning(
                "%d results not sent (%s): the outbox keeps them for a later "
                "heartbeat to send again",
                len(batch),
                exc,
            )


def results_for(
    *, jobs: list[dict], config: HostConfig, timeout_s: float, on_signed=None
) -> list[dict]:
    """Run jobs this runner holds and return one signed result per job, in
    the jobs' order; ``on_signed(job, envelope)`` hears of each as soon as
    its job ends (from several threads at once)."""
    key = config.key
    signed: dict[int, dict] = {}

    def sign(job: dict, result: dict) -> None:
        envelope = protocol.result_envelope(
            job=job, result=result, runner_name=config.name, key=key
        )
        signed[job["job"]] = envelope
        if on_signed is not None:
            on_signed(job, envelope)

    runnable: dict[str, list[dict]] = {}
    digests: dict[str, str | None] = {}
    for job in jobs:
        interpreter = python_for(config, job["toolchain"])
        if interpreter is None:
            sign(
                job, infra_result(job, "this runner does not host the job's toolchain")
            )
        elif mismatch := library_mismatch(job, digests):
            sign(job, infra_result(job, mismatch))
        else:
            runnable.setdefault(interpreter, []).append(job)
    for interpreter, group in runnable.items():
        cache_dir = kernel_cache_root(config) / group[0]["toolchain"][:16]
        cache_dir.mkdir(parents=True, exist_ok=True)
        kernel_cache_keep(config)
        jobs_run(
            jobs=group,
            interpreter=interpreter,
            cache_dir=cache_dir,
            timeout_s=timeout_s,
            on_result=lambda i, result, group=group: sign(group[i], result),
            make_room=lambda: kernel_cache_keep(config, urgent=True),
            disk_short=lambda: disk_short_now(config),
        )
    return [signed[job["job"]] for job in jobs]


def kernel_cache_root(config: HostConfig) -> Path:
    return config.directory / "kernel-cache"


def kernel_cache_keep(config: HostConfig, *, urgent: bool = False) -> None:
    kernel_cache.cache_keep(kernel_cache_root(config), urgent=urgent)


def disk_short_now(config: HostConfig) -> str | None:
    """Why this host has too little free space now, where it keeps its
    outbox and kernel cache or where its harness children write (under
    TILEMATRIX_RUNNER_DISK_FREE_MB); None when it has enough."""
    return disk.disk_short(
        (config.directory, Path(tempfile.gettempdir())),
        agent_config.disk_free_min_bytes(),
    )


def disk_check(config: HostConfig) -> str | None:
    """``disk_short_now``, after the kernel cache has given back what it
    can: why this host should take no job now."""
    if disk_short_now(config) is None:
        return None
    kernel_cache_keep(config, urgent=True)
    return disk_short_now(config)


CLAIM_TIMEOUT_S = 30
ACTIVE = protocol.ACTIVE
OUTBOX_TIMEOUT_S = 30
OUTBOX_SLICE = 500


def _job_keys(reply: dict, field: str) -> set[tuple[int, int]]:
    try:
        return {(int(k["job"]), int(k["attempt"])) for k in reply[field]}
    except (KeyError, TypeError, ValueError):
        raise client.ServerUnavailable(
            f"the server's reply lacks a list of jobs in {field!r}"
        ) from None


def jobs_claim(*, jobs: list[dict], config: HostConfig, retried: bool) -> list[dict]:
    """The jobs this runner now holds, claimed over HTTP (one request; each
    job is claimed atomically on the server, so another delivery of the same
    message gets none of them). A retried message (an earlier delivery could
    not get an answer) also takes the jobs the server says it already holds:
    that earlier claim may have been made and its answer lost. Raises
    client.ServerUnavailable when the message should be tried again later,
    client.ServerRefused when the server refuses the claim and RunnerPaused
    when the runner may take nothing now (maintenance)."""
    reply = client.signed_request(
        config,
        "claim",
        timeout=CLAIM_TIMEOUT_S,
        jobs=[{"job": j["job"], "attempt": j["attempt"]} for j in jobs],
    )
    health = reply.get("health", ACTIVE)
    if health != ACTIVE:
        raise RunnerPaused(health)
    taken = _job_keys(reply, "claimed")
    if retried:
        taken |= _job_keys(reply, "held")
    return [j for j in jobs if (j["job"], j["attempt"]) in taken]


def jobs_execute(
    *, envelope, config: HostConfig, timeout_s: float, retried: bool = False
) -> str:
    """Verify, claim, run and report the jobs of one message, each result
    sent as its job ends; returns what happened, for the log. Raises
    EnvelopeError for a message to drop, client.ServerRefused when the
    server refuses the claim, RunnerPaused when the runner may take nothing
    now (the message is not this runner's to drop) and
    client.ServerUnavailable when the server cannot answer the claim now
    (the message is to be tried again)."""
    jobs = jobs_verify(envelope=envelope, config=config)
    hosted = [j for j in jobs if python_for(config, j["toolchain"])]
    if not hosted:
        return f"jobs {[j['job'] for j in jobs]}: toolchain not hosted here"
    # Before the claim: a runner that would fail every job for want of
    # disk leaves them to the others.
    if short := disk_check(config):
        raise RunnerShortOfDisk(short)
    mine = jobs_claim(jobs=hosted, config=config, retried=retried)
    if not mine:
        return f"jobs {[j['job'] for j in jobs]}: already taken or superseded"
    # The jobs run in a thread of their own; this one sends each result as
    # its job ends (a task's sends stay on the task's thread), after keeping
    # it in the outbox.
    outbox = outbox_dir(config)
    ended: queue.SimpleQueue = queue.SimpleQueue()
    unkept: list[tuple[dict, dict]] = []

    def kept(job: dict, envelope_: dict) -> None:
        end = time.monotonic()
        # A result the outbox cannot hold (a full disk) is sent all the same.
        try:
            outbox_keep(outbox, job, envelope_)
        except OSError as exc:
            log.warning("result of job %s not kept in the outbox: %s", job["job"], exc)
            unkept.append((job, envelope_))
        ended.put((end, envelope_))

    with ThreadPoolExecutor(1, thread_name_prefix="jobs") as pool:
        running = pool.submit(
            results_for, jobs=mine, config=config, timeout_s=timeout_s, on_signed=kept
        )
        results_stream(ended, running)
        signed = running.result()
    if unkept:
        outbox_catch_up(
            outbox, unkept, make_room=lambda: kernel_cache_keep(config, urgent=True)
        )
    for e in signed:
        # A line a job, its id as a field: the same job_id is on the
        # server's lines planning and storing it (JSON logs).
        log.info(
            "job %s ran: %s",
            e["payload"]["job"],
            e["payload"]["result"].get("status"),
            extra={
                "job_id": e["payload"]["job"],
                "attempt": e["payload"]["attempt"],
                "runner": config.name,
            },
        )
    statuses = ", ".join(
        f"{e['payload']['job']}:{e['payload']['result'].get('status')}" for e in signed
    )
    return f"ran {len(mine)} of {len(jobs)} jobs ({statuses})"


def outbox_flush(*, config: HostConfig, settled_s: float = 0.0) -> int:
    """Send again the results of jobs still running for this runner at the
    same attempt (the server says which); forget the rest. Only results kept
    (or last sent again) at least ``settled_s`` ago are looked at: younger
    ones may still be on their way. Returns how many were sent. Raises
    client.ServerUnavailable or ServerRefused when the server cannot say;
    the outbox is then left as it is."""
    entries = {}
    settled = time.time() - settled_s
    for path in outbox_dir(config).glob("*.json"):
        job_id, _, attempt = path.stem.partition("-")
        try:
            kept_at = path.stat().st_mtime
        except FileNotFoundError:
            continue  # forgotten meanwhile
        if job_id.isdigit() and attempt.isdigit() and kept_at <= settled:
            entries[int(job_id), int(attempt)] = path
    keys = sorted(entries)
    waiting: set[tuple[int, int]] = set()
    for start in range(0, len(keys), OUTBOX_SLICE):
        reply = client.signed_request(
            config,
            "outbox",
            timeout=OUTBOX_TIMEOUT_S,
            jobs=[
                {"job": j, "attempt": a} for j, a in keys[start : start + OUTBOX_SLICE]
            ],
        )
        waiting |= _job_keys(reply, "running")
    resend = []
    for key, path in entries.items():
        if key in waiting:
            try:
                resend.append(json.loads(path.read_text()))
                # Not sent again before another settled_s has passed.
                os.utime(path)
            except FileNotFoundError:
                continue  # forgotten meanwhile
        else:
            path.unlink(missing_ok=True)
    if resend:
        results_send(resend)
    return len(resend)


def bundle_execute(*, envelopes: list, config: HostConfig) -> tuple[list, list[str]]:
    """Run the jobs of an offline bundle: signed results, and a reason for
    each message skipped. Its jobs were assigned to this runner when the
    bundle was made, so there is nothing to claim. All the bundle's jobs run
    as one batch, so their kernels compile across all the host's cores at
    once and one child then times them, rather than one round per message."""
    jobs, skipped = [], []
    for i, envelope in enumerate(envelopes, start=1):
        try:
            jobs += jobs_verify(envelope=envelope, config=config)
        except signing.EnvelopeError as exc:
            skipped.append(f"message {i}: {exc}")
    if not jobs:
        return [], skipped
    return (
        results_for(jobs=jobs, config=config, timeout_s=agent_config.job_budget_s()),
        skipped,
    )
