"""Sandboxed validation harness: lower, build and validate one TileLang kernel
per job in a child process, and report one JSON result.

Pure Python and stdlib-first: it imports no Django, because the child runs
inside a toolchain's own interpreter with only that toolchain's packages.
``run_job`` and ``run_batch`` (in ``sandbox``) are the supervisor's API;
``python -m runners.harness JOB.json`` is the command-line supervisor.
"""

from __future__ import annotations

from runners.harness.job import MalformedJob
from runners.harness.sandbox import run_batch, run_job

__all__ = ["MalformedJob", "run_batch", "run_job"]
