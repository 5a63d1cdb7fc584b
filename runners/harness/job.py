"""Parse and check a job before any process is started for it.

A job the harness cannot even describe (JSON with a key given twice or a
NaN, unknown operator, dims or tensors that do not fit, bad dtype, a target
with an unknown or a missing attribute, bad stage, a source whose hash does
not match) is a ``MalformedJob``: the caller's mistake, reported instead of
run.
"""

from __future__ import annotations

import hashlib
import json
import re

from runners.harness import tensors
from runners.harness.result import STAGES
from runners.kernels.base import BACKENDS, DTYPES, MalformedShape

REQUIRED = ("operator", "shape", "dtype", "target")
OPTIONAL = ("stage", "seed", "source", "source_sha256", "timeout_s", "repeats")
MAX_TIMEOUT_S = 3600.0
MAX_REPEATS = 10_000

# A dim must fit a signed 32-bit index, TileLang's default index type.
MAX_DIM = 2**31 - 1
# More than the memory of any host or device, for one tensor.
MAX_TENSOR_BYTES = 2**40

# A target's attributes besides "kind", each required: left out, TileLang
# would build for its default (sm_50, gfx900), not the device meant.
# attribute: (what its value matches, an example).
_TARGET_ATTRIBUTES = {
    "cuda": {"arch": (re.compile(r"sm_\d{2,3}[af]?"), "sm_90a")},
    "hip": {"mcpu": (re.compile(r"gfx[0-9a-f]{3,4}"), "gfx942")},
}
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class MalformedJob(ValueError):
    """The job cannot be run as written; the message says why, in one line."""


def load_job(text: str) -> object:
    """The job JSON ``text`` as Python values, or MalformedJob. Stricter than
    ``json.loads``, which would keep the last of a key given twice, read NaN
    and Infinity (not JSON), and overflow the stack on deep nesting."""
    try:
        return json.loads(
            text, object_pairs_hook=_unique_keys, parse_constant=_not_json
        )
    except MalformedJob:
        raise
    except RecursionError:
        raise MalformedJob("the job JSON is nested too deeply to read") from None
    except ValueError as exc:
        raise MalformedJob(f"the job is not valid JSON: {exc}") from None


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    found = {}
    for key, value in pairs:
        if key in found:
            raise MalformedJob(f"the job JSON gives key {key!r} twice")
        found[key] = value
    return found


def _not_json(constant: str):
    raise MalformedJob(f"the job JSON has {constant}, which is not a JSON number")


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
    _check_sizes(operator, shape, dtype)

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


def _check_sizes(operator, shape: dict, dtype: str) -> None:
    """Refuse dims and tensors no kernel could be built or run for, before
    they overflow inside TileLang and read as the kernel's compile error."""
    for dim, size in shape.items():
        if size > MAX_DIM:
            raise MalformedJob(
                f"{operator.name}: dim {dim} is {size}, above {MAX_DIM} (2**31 - 1)"
            )
    for spec in [*operator.inputs(shape, dtype), *operator.outputs(shape, dtype)]:
        size = tensors.byte_size(tensors.spec_dict(spec))
        if size > MAX_TENSOR_BYTES:
            raise MalformedJob(
                f"{operator.name}: tensor {spec.name} {list(spec.shape)} would take "
                f"{size:.3g} bytes, more than any host can allocate "
                f"(at most {MAX_TENSOR_BYTES / 2**40:g} TiB a tensor)"
            )


def _parse_target(target: object) -> dict:
    if not isinstance(target, dict):
        raise MalformedJob('target must be a TileLang target object like {"kind": "c"}')
    kind = target.get("kind")
    if kind not in BACKENDS:
        raise MalformedJob(f"target kind {kind!r} is not one of {', '.join(BACKENDS)}")
    attributes = _TARGET_ATTRIBUTES.get(kind, {})
    allowed = ["kind", *attributes]
    unknown = [key for key in target if key not in allowed]
    if unknown:
        raise MalformedJob(
            f"target key {unknown[0]!r} is not allowed for kind {kind!r} "
            f"(allowed: {', '.join(allowed)})"
        )
    for key, (pattern, example) in attributes.items():
        value = target.get(key)
        if value is None:
            example_target = json.dumps({"kind": kind, key: example})
            raise MalformedJob(f"a {kind} target needs {key}, e.g. {example_target}")
        if not (isinstance(value, str) and pattern.fullmatch(value)):
            raise MalformedJob(f"target {key} {value!r} is not a {kind} architecture")
    return dict(target)


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
