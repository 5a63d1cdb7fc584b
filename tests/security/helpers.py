"""Attack kernels and the canaries the adversarial tests look for."""

from __future__ import annotations

import hashlib
from pathlib import Path

from matrix.accounts.roles import ADMIN, KERNEL_AUTHOR, REVIEWER, RUNNER_ADMIN, VIEWER

ATTACKS = Path(__file__).parent / "attacks"

ANONYMOUS, NO_ROLE, SUPERUSER = "anonymous", "no role", "superuser"
PERSONAS = (
    ANONYMOUS,
    NO_ROLE,
    VIEWER,
    KERNEL_AUTHOR,
    REVIEWER,
    RUNNER_ADMIN,
    ADMIN,
    SUPERUSER,
)


# Planted where a careless harness or page would leak them.
ENV_CANARY = "tm-env-canary-5f0c11e9"
SETTINGS_CANARY = "tm-settings-canary-7a3e2d90"
KEY_CANARY = "tm-key-canary-c4b8a615"
CANARIES = (ENV_CANARY, SETTINGS_CANARY, KEY_CANARY)


def attack_source(name: str, fill: dict | None = None) -> str:
    source = (ATTACKS / f"{name}.py").read_text()
    for placeholder, value in (fill or {}).items():
        source = source.replace(placeholder, value)
    return source


def attack_job(name: str, *, fill: dict | None = None, **extra) -> dict:
    """A validate job for elementwise_add on the c target running the attack
    kernel NAME as a submitted source."""
    source = attack_source(name, fill)
    return {
        "operator": "elementwise_add",
        "shape": {"M": 6, "N": 9},
        "dtype": "float32",
        "target": {"kind": "c"},
        "seed": 11,
        "source": source,
        "source_sha256": hashlib.sha256(source.encode()).hexdigest(),
        **extra,
    }
