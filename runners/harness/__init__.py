"""Sandboxed validation harness: lower, build and validate one TileLang kernel
per job in a child process, and report one JSON result.

Pure Python and stdlib-first: it imports no Django, because the child runs
inside a toolchain's own interpreter with only that toolchain's packages.
``run_job`` and ``run_batch`` (in ``sandbox``) are the supervisor's API;
``python -m runners.harness JOB.json`` is the command-line supervisor.

The names below load on first use: a submitted kernel's builder and
executor import modules of this package where the operator library (which
``job`` needs) is not even mounted.
"""

from __future__ import annotations

__all__ = ["MalformedJob", "run_batch", "run_job"]


def __getattr__(name: str):
    if name == "MalformedJob":
        from runners.harness.job import MalformedJob

        return MalformedJob
    if name in ("run_batch", "run_job"):
        from runners.harness import sandbox

        return getattr(sandbox, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
