"""Submitted kernels, run through the sandbox: wrong numbers, unwritten
outputs, compile errors, hangs and crashes each end in the right status, and
nothing of the supervisor's environment reaches the child or the result."""

from __future__ import annotations

import resource
import signal
from pathlib import Path

import pytest

from runners.harness.result import MESSAGE_CAP
from runners.harness.sandbox import run_batch
from tests.harness.helpers import (
    CANARY,
    DJANGO_CANARY,
    PLANTED,
    processes_with,
    sleep_token,
    submitted_job,
)

HANG_TIMEOUT_S = 8.0


@pytest.fixture(scope="module")
def results(planted_secrets):
    """All submitted kernels in one batch: each still gets its own children."""
    sleeper = sleep_token()
    jobs = {
        "wrong": submitted_job("wrong_add", {"M": 33, "N": 17}),
        "unwritten": submitted_job("unwritten_add"),
        "layout_small": submitted_job(
            "layout_failure_add", {"M": 16, "N": 16}, fill={"CANARY_LINE": CANARY}
        ),
        "layout_large": submitted_job(
            "layout_failure_add", {"M": 48, "N": 80}, fill={"CANARY_LINE": CANARY}
        ),
        "env_probe": submitted_job("env_probe"),
        "hang": submitted_job(
            "hang_add", fill={"@SLEEP@": sleeper}, timeout_s=HANG_TIMEOUT_S
        ),
        "segfault": submitted_job("segfault"),
        "wrong_signature": submitted_job("wrong_signature_add"),
    }
    outcome = run_batch(
        list(jobs.values()), cache_dir="unused-for-submitted", workers=2
    )
    return {**dict(zip(jobs, outcome, strict=True)), "sleeper": sleeper}


def test_a_wrong_kernel_is_a_mismatch(results):
    result = results["wrong"]
    assert result["status"] == "mismatch"
    assert result["stage_reached"] == "validate"
    assert result["metrics"]["rel_err"] > 1.0
    assert "relative error" in result["error"]["message"]


def test_a_kernel_that_never_writes_its_output_is_a_mismatch(results):
    result = results["unwritten"]
    assert result["status"] == "mismatch"
    assert "never written" in result["error"]["message"]


def test_a_compile_error_names_the_pass_and_leaks_no_secret_or_home(results):
    result = results["layout_small"]
    assert result["status"] == "compile_error"
    assert result["stage_reached"] == "lower"
    assert result["error"]["pass_name"] == "LayoutInference"
    message = result["error"]["message"]
    assert "layout for fragment F can not be inferred" in message
    assert "submitted_kernel.py" in message  # where, without the temp dir
    for secret in (CANARY, DJANGO_CANARY, *PLANTED.values()):
        assert secret not in message
    assert str(Path.home()) + "/" not in message
    assert "tm-harness-" not in message


def test_the_same_error_at_other_shapes_and_paths_shares_its_signature(results):
    small, large = results["layout_small"], results["layout_large"]
    assert large["status"] == "compile_error"
    assert small["error"]["signature"] == large["error"]["signature"]
    assert small["error"]["signature"] != results["env_probe"]["error"]["signature"]


def test_the_child_sees_no_credentials_and_a_temporary_home(results):
    result = results["env_probe"]
    assert result["status"] == "compile_error"
    message = result["error"]["message"]
    names = message.split("env names: ")[1].split(";")[0].split()
    assert "PATH" in names and "HOME" in names
    assert not [n for n in names if n.startswith(("DJANGO_", "CELERY_"))]
    assert "DATABASE_URL" not in names and "TM_CANARY_SECRET" not in names
    assert "no-canary" in message and CANARY not in message


def test_the_child_runs_under_resource_limits(results):
    message = results["env_probe"]["error"]["message"]
    limits = dict(pair.split("=") for pair in message.split("limits: ")[1].split())
    infinity = str(resource.RLIM_INFINITY)
    assert limits["CORE"] == "0"
    assert infinity not in (limits["AS"], limits["CPU"], limits["FSIZE"])


def test_a_hanging_kernel_times_out_and_leaves_no_process(results):
    result = results["hang"]
    assert result["status"] == "timeout"
    assert result["stage_reached"] == "validate"
    assert HANG_TIMEOUT_S <= result["timings"]["wall_s"] < HANG_TIMEOUT_S + 120
    # The process program() started went with its sandbox.
    assert processes_with(results["sleeper"]) == []


def test_a_crash_is_a_runtime_error_with_capped_output(results):
    result = results["segfault"]
    assert result["status"] == "runtime_error"
    message = result["error"]["message"]
    assert message.startswith(
        f"the kernel process died: killed by {signal.SIGSEGV.name}"
    )
    assert len(message.encode()) <= MESSAGE_CAP + 64


def test_a_program_not_taking_the_operators_tensors_is_refused_before_compiling(
    results,
):
    result = results["wrong_signature"]
    assert result["status"] == "compile_error"
    assert result["stage_reached"] == "lower"
    assert result["error"]["message"] == (
        "ProgramRefused: parameter C is [5, 7] float16; "
        "the operator passes C as [5, 7] float32"
    )
