"""Kernels whose native code reaches past TIR's own operators, or that read
their own outputs: each is refused before it is built, naming the construct
and its line, through the real sandbox (builder, executor, judge). Before
the executor checked the PrimFunc, each of these was stored as a pass: the
Python C API made torch compute the outputs or stopped the clock, getuid()
told the sandbox from production, and reading the poison made the timed
calls skip their work."""

from __future__ import annotations

import pytest

from runners.harness.sandbox import run_batch
from tests.security.helpers import attack_job

ATTACKS = (
    "extern_python",
    "extern_clock",
    "detect_sandbox",
    "packed_call",
    "inject_source",
    "read_poisoned_output",
    "address_of_input",
)


@pytest.fixture(scope="module")
def attacked():
    names = ("good_add", *ATTACKS)
    results = run_batch(
        [attack_job(name) for name in names], cache_dir="unused", workers=2
    )
    return dict(zip(names, results, strict=True))


def _message(result: dict) -> str:
    return (result["error"] or {}).get("message") or ""


def test_the_honest_control_beside_them_passes(attacked):
    good = attacked["good_add"]
    assert good["status"] == "pass"
    # Its calls were timed by the executor, the reference's by the judge.
    # The source shown is what the executor sent before the kernel ran.
    assert "void" in good["kernel_source"] or "def" in good["kernel_source"]
    samples = good["timing_samples"]
    assert len(samples["kernel_ms"]) >= 5 and len(samples["reference_ms"]) >= 5


@pytest.mark.parametrize(
    ("name", "named"),
    [
        ("extern_python", "T.call_extern 'PyRun_SimpleString'"),
        ("extern_clock", "T.call_pure_extern 'PyRun_SimpleString'"),
        ("detect_sandbox", "T.call_extern 'getuid'"),
        ("packed_call", "T.tvm_call_packed"),
        ("inject_source", "pragma_import_c"),
        ("read_poisoned_output", "C[bx, 0]: C is an output"),
        ("address_of_input", "T.address_of"),
    ],
)
def test_native_code_outside_tir_never_runs(attacked, name, named):
    result = attacked[name]
    assert result["status"] == "compile_error", result
    message = _message(result)
    assert named in message
    # The line of the PrimFunc's TVMScript it stands on.
    assert "line 1" in message or ": line " in message or "line " in message
    assert "line 0 " not in message
    assert result["timings"].get("kernel_ms") is None
