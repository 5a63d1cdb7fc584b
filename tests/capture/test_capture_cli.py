"""`python -m runners.capture MODULE:FACTORY --tokens ... --out ...`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from runners.capture import main, trace_module
from tests.capture.tiny_decoder import build

ROOT = Path(__file__).resolve().parents[2]
FACTORY = "tests.capture.tiny_decoder:build"


def capture(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "runners.capture", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_it_writes_the_trace_of_the_named_factory(tmp_path):
    out = tmp_path / "trace.json"

    done = capture(FACTORY, "--tokens", "1,5", "--out", str(out))

    assert done.returncode == 0, done.stderr
    trace = json.loads(out.read_text())
    assert trace["model"] == FACTORY
    assert trace["tokens"] == [1, 5]
    assert trace["dtype"] == "float32"
    expected = trace_module(build(), tokens=[1, 5], model=FACTORY)
    assert trace["calls"] == expected["calls"]
    assert f"{len(expected['calls'])} shapes" in done.stdout


def test_a_bad_factory_exits_2_with_one_line(tmp_path):
    done = capture(
        "no_such_module:build", "--tokens", "1", "--out", str(tmp_path / "t")
    )

    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0
    assert "cannot import 'no_such_module'" in done.stderr
    assert not (tmp_path / "t").exists()


@pytest.mark.parametrize(
    ("factory", "tokens", "message"),
    [
        ("tests.capture.tiny_decoder", "1", "is not MODULE:FACTORY"),
        ("tests.capture.tiny_decoder:missing", "1", "has no callable 'missing'"),
        (
            "tests.capture.tiny_decoder:not_a_module",
            "1",
            "returned int, not a torch.nn",
        ),
        (FACTORY, "1,x", "not a comma-separated list"),
        (FACTORY, "0", "not a comma-separated list"),
        (FACTORY, "5,5", "not a comma-separated list"),
    ],
)
def test_it_refuses_a_bad_command_line_in_one_line(
    tmp_path, capsys, factory, tokens, message
):
    out = tmp_path / "trace.json"

    with pytest.raises(SystemExit) as exit_:
        main([factory, "--tokens", tokens, "--out", str(out)])

    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert message in err
    assert not out.exists()


def test_a_module_without_an_embedding_needs_its_hidden_size(tmp_path, capsys):
    factory = "tests.capture.tiny_decoder:one_block"
    out = tmp_path / "trace.json"

    with pytest.raises(SystemExit):
        main([factory, "--tokens", "3", "--out", str(out)])
    assert "pass --hidden N" in capsys.readouterr().err

    assert main([factory, "--tokens", "3", "--out", str(out), "--hidden", "64"]) == 0
    operators = {c["operator"] for c in json.loads(out.read_text())["calls"]}
    assert operators == {"gemm", "attention_causal", "rmsnorm", "elementwise_add"}


def _dtypes(trace: dict) -> set[str]:
    return {c["dtype"] for c in trace["calls"]}


def test_without_dtype_a_half_model_records_float16_shapes(tmp_path, capsys):
    """Issue 19: the module was cast to float32 by default, so an fp16 model
    captured without the flag recorded float32 shapes."""
    out = tmp_path / "trace.json"

    assert main([f"{FACTORY}_half", "--tokens", "1,5", "--out", str(out)]) == 0

    trace = json.loads(out.read_text())
    assert (trace["dtype"], trace["cast"]) == ("float16", False)
    assert _dtypes(trace) == {"float16"}
    assert "(in the module's own float16)" in capsys.readouterr().out
    as_float32 = trace_module(build(), tokens=[1, 5], model=FACTORY)
    assert len(trace["calls"]) == len(as_float32["calls"])


def test_with_dtype_it_casts_the_module_and_says_so(tmp_path, capsys):
    out = tmp_path / "trace.json"

    main([f"{FACTORY}_half", "--tokens", "3", "--out", str(out), "--dtype", "bfloat16"])

    trace = json.loads(out.read_text())
    assert (trace["dtype"], trace["cast"]) == ("bfloat16", True)
    assert _dtypes(trace) == {"bfloat16"}
    assert "(cast to bfloat16)" in capsys.readouterr().out


def test_a_half_block_without_an_embedding_is_fed_half_hidden_states():
    from tests.capture.tiny_decoder import one_block

    trace = trace_module(one_block().half(), tokens=[3], model="block", hidden=64)

    assert (trace["dtype"], trace["cast"]) == ("float16", False)
    assert _dtypes(trace) == {"float16"}
