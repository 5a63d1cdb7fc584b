"""Sandboxed validation harness: lower, build and validate one TileLang kernel
per job in a child process, and report one JSON result.

Pure Python and stdlib-first: it imports no Django, because the child runs
inside a toolchain's own interpreter with only that toolchain's packages.
``run_job`` and ``run_batch`` (in ``sandbox``) are the supervisor's API;
``python -m runners.harness JOB.json`` is the command-line supervisor.
"""
