"""A minimal repro of a bisection's finding: the harness job of its cell and
the commands that run it with the two toolchains on either side of the
change, on any host with the repository (no server, no runner key)."""

from __future__ import annotations

import shlex

from matrix.fleet.models import RunnerToolchain

JOB_FILE = "job.json"


def harness_job(*, revision, shape, device_type, seed: int = 0) -> dict:
    """The job `python -m runners.harness` runs: the one the planner sends,
    less what only a runner needs (job id, attempt, toolchain)."""
    job = {
        "operator": revision.operator.name,
        "shape": shape.dims,
        "dtype": shape.dtype,
        "target": device_type.target,
        "stage": "validate",
        "seed": seed,
    }
    if revision.origin != revision.Origin.LIBRARY:
        # A submitted kernel travels with its text; the harness checks the
        # hash and runs it in a child of its own.
        job["source"] = revision.source
        job["source_sha256"] = revision.source_sha256
    return job


def venv_dir(version: str) -> str:
    """Where `make toolchains` puts a release's toolchain."""
    return f"var/toolchains/tilelang-{version}"


def interpreter_of(toolchain, device_type) -> tuple[str, str]:
    """(interpreter, where it is): a runner's, where one with the device
    hosts the toolchain, else the one scripts/make-toolchain-venv builds."""
    hosted = (
        RunnerToolchain.objects.filter(
            toolchain=toolchain, runner__device_types=device_type
        )
        .select_related("runner")
        .order_by("runner__name")
        .first()
    )
    if hosted is not None:
        return hosted.interpreter, f"on runner {hosted.runner.name}"
    return f"{venv_dir(toolchain.tilelang_version)}/bin/python", ""


def repro_for(*, bisection, sides: list[tuple[object, str]]) -> dict:
    """``sides``: (toolchain, status) of the rungs either side of the change,
    the named release first."""
    job = harness_job(
        revision=bisection.revision,
        shape=bisection.shape,
        device_type=bisection.device_type,
    )
    commands, builds = [], []
    for toolchain, status in sides:
        interpreter, where = interpreter_of(toolchain, bisection.device_type)
        if not where:
            version = toolchain.tilelang_version
            builds.append(
                f"scripts/make-toolchain-venv {shlex.quote(version)} "
                f"{shlex.quote(venv_dir(version))}"
            )
        note = f"TileLang {toolchain.tilelang_version}: {status}"
        if where:
            note += f" ({where})"
        commands.append(
            f"python -m runners.harness {JOB_FILE} --interpreter "
            f"{shlex.quote(interpreter)}  # {note}"
        )
    return {"job": job, "file": JOB_FILE, "build": builds, "commands": commands}
