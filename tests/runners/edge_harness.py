"""Edge double of the sandboxed harness (runners.harness.sandbox.run_batch)
for tests about messaging, not kernels: it answers like the harness would
for a CPU host, after TILEMATRIX_EDGE_HARNESS_DELAY_S seconds, without
starting TileLang. Selected with TILEMATRIX_HARNESS=tests.runners.edge_harness."""

from __future__ import annotations

import os
import time

SUCCESS = {"lower": "lowered", "build": "built", "validate": "pass"}


def run_job(
    job: dict,
    *,
    interpreter: str,
    cache_dir: str,
    timeout_s: float,
    trusted: bool = True,
) -> dict:
    time.sleep(float(os.environ.get("TILEMATRIX_EDGE_HARNESS_DELAY_S", "0")))
    return {
        "status": SUCCESS[job["stage"]],
        "stage_reached": job["stage"],
        "metrics": {"rel_err": 0.0, "max_abs_err": 0.0, "mismatch_ratio": 0.0},
        # Slow enough for any served shape on any device (ingest refuses a
        # time faster than the device's datasheet allows), twice as fast as
        # the reference.
        "timings": {"compile_s": 0.01, "kernel_ms": 100.0, "reference_ms": 200.0},
        "error": None,
        "fingerprint": {"hash": "e" * 64, "components": {}},
        "operator": job["operator"],
        "stage": job["stage"],
    }


def run_batch(
    jobs: list[dict],
    *,
    interpreter: str,
    cache_dir: str,
    timeout_s: float,
    trusted: bool = True,
    workers: int = 1,
    on_result=None,
    keep_warm: bool = False,
) -> list[dict]:
    results = []
    for i, job in enumerate(jobs):
        results.append(
            run_job(
                job, interpreter=interpreter, cache_dir=cache_dir, timeout_s=timeout_s
            )
        )
        if on_result is not None:
            on_result(i, results[-1])
    return results
