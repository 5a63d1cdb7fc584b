"""Fails on purpose, reporting what the sandbox let it see: every environment
variable name, HOME, the canary's value if it got through, and its resource
limits."""

import os
import resource


def program(shape, dtype, target):
    names = " ".join(sorted(os.environ))
    canary = os.environ.get("TM_CANARY_SECRET", "no-canary")
    limits = {
        name: resource.getrlimit(getattr(resource, f"RLIMIT_{name}"))[1]
        for name in ("AS", "CPU", "FSIZE", "CORE")
    }
    raise RuntimeError(
        f"env names: {names}; home: {os.environ['HOME']}; {canary}; "
        f"limits: {' '.join(f'{k}={v}' for k, v in limits.items())}"
    )
