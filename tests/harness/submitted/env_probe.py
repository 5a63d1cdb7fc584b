"""Fails on purpose, reporting what the sandbox let it see: every environment
variable name, HOME and the canary's value if it got through."""

import os


def program(shape, dtype, target):
    names = " ".join(sorted(os.environ))
    canary = os.environ.get("TM_CANARY_SECRET", "no-canary")
    raise RuntimeError(f"env names: {names}; home: {os.environ['HOME']}; {canary}")
