"""Parse and check a job before any process is started for it.

A job the harness cannot even describe (unknown operator, dims that do not
fit, bad dtype, target or stage, a source whose hash does not match) is a
``MalformedJob``: the caller's mistake, reported instead of run.
"""

from __future__ import annotations

import hashlib
import re

from runners.harness.result import STAGES
from runners.kernels.base import BACKENDS, DTYPES, MalformedShape

REQUIRED = ("operator", "shape", "dtype", "target")
OPTIONAL = ("stage", "seed", "source", "source_sha256", "timeout_s", "repeats")
MAX_TIMEOUT_S = 3600.0
MAX_REPEATS = 10_000

_TARGET_KEY = re.compile(r"^[a-z][a-z0-9_-]*$")
_TARGET_ARCH = {
    "cuda": ("arch", re.compile(r"^sm_\d{2,3}[af]?$")),
    "hip": ("mcpu", re.compile(r"^gfx[0-9a-f]{3,4}$")),
}
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class MalformedJob(ValueError):
    """The job cannot be run as written; the message says why, in one line."""


def lookup_operator(name: str):
    """The library operator called ``name``, or ``MalformedJob``."""
    from runners import kernels

    try:
        return kernels.get(name)
    except KeyError:
        known = ", ".join(sorted(kernels.OPERATORS))
        raise MalformedJob(f"unknown operator {name!r} (known: {known})") from None


def parse_job(raw: object) -> dict:
    """Return the job as a normalized, JSON-ready dict, or raise MalformedJob."""
    if not isinstance(raw, dict):
        raise MalformedJob("a job must be a JSON object")
    missing = [k for k in REQUIRED if k not in raw]
    unknown = sorted(set(raw) - set(REQUIRED) - set(OPTIONAL))
    if missing:
        raise MalformedJob(f"job lacks {', '.join(missing)}")
    if unknown:
        raise MalformedJob(f"job has unknown fields {', '.join(unknown)}")

    name = raw["operator"]
    if not isinstance(name, str):
        raise MalformedJob("operator must be a string")
    operator = lookup_operator(name)
    try:
        shape = operator.validate_shape(raw["shape"])
    except MalformedShape as exc:
        raise MalformedJob(str(exc)) from None

    dtype = raw["dtype"]
    if dtype not in DTYPES:
        raise MalformedJob(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    stage = raw.get("stage", "validate")
    if stage not in STAGES:
        raise MalformedJob(f"stage {stage!r} is not one of {', '.join(STAGES)}")

    job = {
        "operator": name,
        "shape": shape,
        "dtype": dtype,
        "target": _parse_target(raw["target"]),
        "stage": stage,
        "seed": _int_field(raw, "seed", default=0, low=0, high=2**63 - 1),
        "source": None,
        "source_sha256": None,
        "timeout_s": None,
        "repeats": None,
    }
    if "repeats" in raw:
        job["repeats"] = _int_field(
            raw, "repeats", default=None, low=1, high=MAX_REPEATS
        )
    if "timeout_s" in raw:
        job["timeout_s"] = _timeout(raw["timeout_s"])
    if "source" in raw or "source_sha256" in raw:
        job["source"], job["source_sha256"] = _source(raw)
    return job


def _parse_target(target: object) -> dict:
    if not isinstance(target, dict):
        raise MalformedJob('target must be a TileLang target object like {"kind": "c"}')
    kind = target.get("kind")
    if kind not in BACKENDS:
        raise MalformedJob(f"target kind {kind!r} is not one of {', '.join(BACKENDS)}")
    for key, value in target.items():
        if not isinstance(key, str) or not _TARGET_KEY.match(key):
            raise MalformedJob(f"target key {key!r} is not a target attribute name")
        if not _plain_target_value(value):
            raise MalformedJob(f"target {key} must be a string, number or list of them")
    if kind in _TARGET_ARCH:
        key, pattern = _TARGET_ARCH[kind]
        value = target.get(key)
        if value is not None and not (isinstance(value, str) and pattern.match(value)):
            raise MalformedJob(f"target {key} {value!r} is not a {kind} architecture")
    return dict(target)


def _plain_target_value(value: object) -> bool:
    if isinstance(value, list):
        return all(isinstance(v, (str, int)) and not isinstance(v, bool) for v in value)
    return isinstance(value, (str, int, float, bool))


def _int_field(raw: dict, key: str, *, default, low: int, high: int):
    if key not in raw:
        return default
    value = raw[key]
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or not low <= value <= high
    ):
        raise MalformedJob(f"{key} must be an integer from {low} to {high}")
    return value


def _timeout(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise MalformedJob("timeout_s must be a number of seconds")
    if not 0 < value <= MAX_TIMEOUT_S:
        raise MalformedJob(f"timeout_s must be above 0 and at most {MAX_TIMEOUT_S:g}")
    return float(value)


def _source(raw: dict) -> tuple[str, str]:
    source, claimed = raw.get("source"), raw.get("source_sha256")
    if not isinstance(source, str) or not source.strip():
        raise MalformedJob("source must be the kernel's Python text")
    if not isinstance(claimed, str) or not _SHA256.match(claimed):
        raise MalformedJob("source_sha256 must be 64 lowercase hex digits")
    actual = hashlib.sha256(source.encode()).hexdigest()
    if actual != claimed:
        # A mismatch means the text is not the reviewed revision: never run it.
        raise MalformedJob(
            "source_sha256 does not match the source; refusing to run it"
        )
    return source, claimed
