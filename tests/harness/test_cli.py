"""``python -m runners.harness JOB.json``: one JSON result and exit 0 whatever
the kernel did; a malformed job exits non-zero with one line on stderr."""

from __future__ import annotations

import hashlib
import json

import pytest

from runners.harness.result import METRIC_KEYS, STATUSES, TIMING_KEYS
from tests.harness.helpers import library_job, run_cli

RESULT_KEYS = {
    "status",
    "stage_reached",
    "metrics",
    "timings",
    "error",
    "fingerprint",
    "kernel_source",
    "tolerance",
    "distributions",
    "timing_samples",
    "sandbox",
    "operator",
    "shape",
    "dtype",
    "target",
    "stage",
    "seed",
    "source_sha256",
}

SOFTMAX = library_job("softmax", {"M": 3, "N": 37})
GEMM = library_job("gemm", {"M": 64, "N": 64, "K": 64})
SOURCE = "def program(shape, dtype, target):\n    raise ValueError('x')\n"

MALFORMED = {
    "unknown operator": ({**SOFTMAX, "operator": "softmaxx"}, "unknown operator"),
    "missing dim": ({**SOFTMAX, "shape": {"M": 3}}, "missing ['N']"),
    "extra dim": ({**SOFTMAX, "shape": {"M": 3, "N": 4, "K": 5}}, "unexpected"),
    "zero dim": ({**SOFTMAX, "shape": {"M": 0, "N": 4}}, "positive int"),
    "bad dtype": ({**SOFTMAX, "dtype": "float8"}, "dtype 'float8'"),
    "bad target kind": ({**SOFTMAX, "target": {"kind": "tpu"}}, "target kind"),
    "bad cuda arch": (
        {**SOFTMAX, "target": {"kind": "cuda", "arch": "sm90"}},
        "not a cuda architecture",
    ),
    "unknown target key": (
        {**SOFTMAX, "target": {"kind": "c", "foo": "bar"}},
        "target key 'foo' is not allowed for kind 'c' (allowed: kind)",
    ),
    "cuda target key of another kind": (
        {**SOFTMAX, "target": {"kind": "cuda", "arch": "sm_90a", "mcpu": "gfx942"}},
        "(allowed: kind, arch)",
    ),
    # TileLang's defaults, sm_50 and gfx900, are no device the job meant.
    "cuda without arch": (
        {**SOFTMAX, "target": {"kind": "cuda"}},
        "a cuda target needs arch",
    ),
    "hip without mcpu": (
        {**SOFTMAX, "target": {"kind": "hip"}},
        "a hip target needs mcpu",
    ),
    "dim above int32": (
        {**SOFTMAX, "shape": {"M": 3, "N": 10**30}},
        f"dim N is {10**30}, above 2147483647",
    ),
    "tensor larger than any host": (
        {**GEMM, "shape": {"M": 2**21, "N": 2**21, "K": 2**21}},
        "tensor A [2097152, 2097152] would take 1.76e+13 bytes, more than any host",
    ),
    "target as string": ({**SOFTMAX, "target": "c"}, "target must be"),
    "bad stage": ({**SOFTMAX, "stage": "run"}, "stage 'run'"),
    "unknown field": ({**SOFTMAX, "stge": "lower"}, "unknown fields stge"),
    "negative seed": ({**SOFTMAX, "seed": -1}, "seed must be"),
    "tampered source": (
        {
            **SOFTMAX,
            "source": SOURCE + "# changed after review\n",
            "source_sha256": hashlib.sha256(SOURCE.encode()).hexdigest(),
        },
        "does not match",
    ),
    "not json": ("{operator: softmax", "not valid JSON"),
    "duplicate key": (
        json.dumps(SOFTMAX)[:-1] + ', "operator": "gemm"}',
        "gives key 'operator' twice",
    ),
    "NaN": (json.dumps(SOFTMAX)[:-1] + ', "timeout_s": NaN}', "has NaN"),
    "Infinity": (json.dumps(SOFTMAX)[:-1] + ', "timeout_s": Infinity}', "Infinity"),
    "deep nesting": ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
}


@pytest.mark.parametrize("job, expected", MALFORMED.values(), ids=MALFORMED.keys())
def test_a_malformed_job_exits_non_zero_with_one_line(job, expected, tmp_path):
    done = run_cli(job, tmp_path=tmp_path)
    assert done.returncode != 0
    assert done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1
    assert expected in done.stderr


@pytest.mark.parametrize("timeout", ["nan", "inf", "0", "-5", "1e300", "soon"])
def test_a_timeout_that_cannot_bound_a_job_is_a_usage_error(timeout, tmp_path):
    done = run_cli(SOFTMAX, f"--timeout={timeout}", tmp_path=tmp_path)
    assert done.returncode == 2
    assert done.stdout == ""
    (line,) = done.stderr.strip().splitlines()
    assert f"argument --timeout: {timeout!r} is not a number" in line


def test_a_job_prints_one_json_result_and_exits_zero(tmp_path, cache_dir):
    done = run_cli(SOFTMAX, "--cache-dir", cache_dir, tmp_path=tmp_path)
    assert done.returncode == 0, done.stderr
    (line,) = done.stdout.splitlines()
    result = json.loads(line)
    assert set(result) == RESULT_KEYS
    assert result["status"] == "pass" and result["status"] in STATUSES
    assert result["sandbox"] == "full: bwrap namespaces and a uid of its own"
    assert set(result["metrics"]) == set(METRIC_KEYS)
    assert set(result["timings"]) == set(TIMING_KEYS)
    assert result["error"] is None
    assert result["fingerprint"]["components"]["tilelang"] == "0.1.15"
    assert "softmax" in result["kernel_source"]
    assert result["tolerance"]["reason"]
    echoed = {k: result[k] for k in ("operator", "shape", "dtype", "target", "seed")}
    assert echoed == SOFTMAX and result["stage"] == "validate"


def test_a_failing_kernel_still_exits_zero(tmp_path):
    job = {
        **SOFTMAX,
        "source": SOURCE,
        "source_sha256": hashlib.sha256(SOURCE.encode()).hexdigest(),
    }
    done = run_cli(job, tmp_path=tmp_path)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["status"] == "compile_error"
    assert result["error"]["message"] == "ValueError: x"
