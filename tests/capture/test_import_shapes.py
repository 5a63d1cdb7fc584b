"""`manage.py import_shapes` from a built-in profile and from a captured trace."""

from __future__ import annotations

import json
import re
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from matrix import profiles
from matrix.models import Operator, ServedCall, Shape
from runners.capture import trace_module
from tests.capture.tiny_decoder import build

OPERATOR_DIMS = {
    "elementwise_add": ["M", "N"],
    "softmax": ["M", "N"],
    "rmsnorm": ["M", "N"],
    "gemm": ["M", "N", "K"],
    "attention": ["B", "H", "HKV", "S", "D"],
    "attention_causal": ["B", "H", "HKV", "S", "D"],
}


@pytest.fixture
def operators(db):
    # The operators the profiles and the decoder call, declared here so the
    # tests do not depend on which kernels the library ships yet.
    for name, dims in OPERATOR_DIMS.items():
        Operator.objects.get_or_create(name=name, defaults={"dims": dims})


def import_shapes(*args: str) -> str:
    out = StringIO()
    call_command("import_shapes", *args, stdout=out)
    return out.getvalue()


def shape(operator: str, dtype: str, **dims) -> Shape:
    key = ",".join(f"{k}={v}" for k, v in dims.items())
    return Shape.objects.get(operator__name=operator, dims_key=key, dtype=dtype)


@pytest.fixture
def tiny_trace(tmp_path):
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(trace_module(build(), tokens=[1, 5], model="tiny")))
    return path


def test_a_profile_imports_its_served_shapes_with_calls_per_forward(operators):
    output = import_shapes(
        "--profile", "llama-3-8b", "--tokens", "1,16", "--dtypes", "float16"
    )

    expected = list(
        profiles.served_shapes("llama-3-8b", tokens=[1, 16], dtypes=["float16"])
    )
    assert Shape.objects.served().filter(source_profile="llama-3-8b").count() == len(
        expected
    )
    qkv = shape("gemm", "float16", M=16, N=6144, K=4096)
    assert (qkv.served, qkv.weight) == (True, 32.0)
    assert shape("rmsnorm", "float16", M=1, N=4096).weight == 65.0
    assert (
        shape("attention_causal", "float16", B=1, H=32, HKV=8, S=16, D=128).weight == 32
    )
    assert f"llama-3-8b: {len(expected)} shapes: {len(expected)} created" in output


def test_a_second_import_of_the_same_profile_changes_nothing(operators):
    import_shapes("--profile", "mixtral-8x7b")
    before = list(
        Shape.objects.values_list("operator__name", "dims_key", "dtype", "weight")
    )

    output = import_shapes("--profile", "mixtral-8x7b")

    after = list(
        Shape.objects.values_list("operator__name", "dims_key", "dtype", "weight")
    )
    assert after == before
    assert (
        f"{len(before)} shapes: 0 created, 0 updated, {len(before)} unchanged" in output
    )


def test_a_single_token_runs_only_its_top_k_experts(operators):
    import_shapes("--profile", "mixtral-8x7b", "--tokens", "1", "--dtypes", "bfloat16")

    # One token routed to 2 of 8 experts: 2 expert MLPs per layer, not 8.
    assert shape("gemm", "bfloat16", M=1, N=28672, K=4096).weight == 32 * 2
    assert shape("gemm", "bfloat16", M=1, N=8, K=4096).weight == 32  # router


def test_a_trace_imports_its_calls_as_served_shapes(operators, tiny_trace):
    trace = json.loads(tiny_trace.read_text())

    output = import_shapes("--trace", str(tiny_trace), "--name", "tiny-decoder")

    imported = Shape.objects.filter(source_profile="tiny-decoder")
    assert imported.count() == len(trace["calls"])
    for call in trace["calls"]:
        s = shape(call["operator"], call["dtype"], **call["dims"])
        assert (s.served, s.weight) == (True, call["count"])
    assert f"tiny-decoder: {len(trace['calls'])} shapes" in output
    assert "gemm" in output and "attention_causal" in output


def test_a_second_import_of_the_same_trace_changes_nothing(operators, tiny_trace):
    import_shapes("--trace", str(tiny_trace))
    before = list(
        Shape.objects.values_list("dims_key", "dtype", "weight", "source_profile")
    )

    output = import_shapes("--trace", str(tiny_trace))

    after = list(
        Shape.objects.values_list("dims_key", "dtype", "weight", "source_profile")
    )
    assert after == before
    assert {s for *_, s in after} == {"tiny"}
    assert "0 created, 0 updated" in output


def test_a_shape_traced_at_several_token_counts_weighs_their_sum(operators, tmp_path):
    gemm = {"operator": "gemm", "dims": {"M": 8, "N": 16, "K": 32}, "dtype": "float16"}
    path = tmp_path / "trace.json"
    calls = [{**gemm, "count": 2, "tokens": 1}, {**gemm, "count": 3, "tokens": 5}]
    path.write_text(json.dumps({"model": "m", "calls": calls}))

    import_shapes("--trace", str(path))

    assert shape("gemm", "float16", M=8, N=16, K=32).weight == 5


def served_calls(source: str) -> dict:
    return {
        (c.shape.operator.name, c.shape.dims_key, c.shape.dtype, c.tokens): c.calls
        for c in ServedCall.objects.filter(source=source).select_related(
            "shape__operator"
        )
    }


def test_two_models_calling_one_shape_each_keep_their_own_count(operators):
    import_shapes("--profile", "llama-3-8b", "--tokens", "1", "--dtypes", "float16")
    import_shapes("--profile", "mixtral-8x7b", "--tokens", "1", "--dtypes", "float16")

    # Llama's gate+up projection at one token: once per layer. Mixtral runs
    # the same shape in each of its 2 active experts per layer.
    key = ("gemm", "M=1,N=28672,K=4096", "float16", 1)
    assert served_calls("llama-3-8b")[key] == 32
    assert served_calls("mixtral-8x7b")[key] == 64
    # Attention is the same for both: counted for each, though the shape
    # names only the first model as its source.
    attention = ("attention_causal", "B=1,H=32,HKV=8,S=1,D=128", "float16", 1)
    assert served_calls("llama-3-8b")[attention] == 32
    assert served_calls("mixtral-8x7b")[attention] == 32


def test_a_shape_two_models_call_weighs_both_whatever_the_order(operators):
    args = ("--tokens", "1", "--dtypes", "float16")
    import_shapes("--profile", "llama-3-8b", *args)
    import_shapes("--profile", "mixtral-8x7b", *args)
    gate_up = Shape.objects.get(dims_key="M=1,N=28672,K=4096", dtype="float16")
    # 32 calls a step from Llama, 64 from Mixtral's two experts.
    assert gate_up.weight == 96
    # Importing Llama again (as every `make seed` does) changes nothing.
    output = import_shapes("--profile", "llama-3-8b", *args)
    assert " 0 updated" in output
    gate_up.refresh_from_db()
    assert gate_up.weight == 96


def test_a_profile_records_each_step_size_apart(operators):
    import_shapes("--profile", "llama-3-8b", "--tokens", "1,16", "--dtypes", "float16")

    calls = served_calls("llama-3-8b")
    assert calls[("rmsnorm", "M=1,N=4096", "float16", 1)] == 65
    assert calls[("rmsnorm", "M=16,N=4096", "float16", 16)] == 65
    # The shapes' weights stay the calls over every step imported.
    assert sum(calls.values()) == sum(
        Shape.objects.served().values_list("weight", flat=True)
    )


def test_importing_a_model_again_replaces_its_counts(operators, tmp_path):
    gemm = {"operator": "gemm", "dims": {"M": 8, "N": 16, "K": 32}, "dtype": "float16"}
    path = tmp_path / "trace.json"
    path.write_text(
        json.dumps({"model": "m", "calls": [{**gemm, "count": 2, "tokens": 1}]})
    )
    import_shapes("--trace", str(path))
    path.write_text(
        json.dumps({"model": "m", "calls": [{**gemm, "count": 7, "tokens": 4}]})
    )

    import_shapes("--trace", str(path))

    assert served_calls("m") == {("gemm", "M=8,N=16,K=32", "float16", 4): 7}


def test_a_trace_without_token_counts_records_its_calls_unsplit(operators, tmp_path):
    gemm = {"operator": "gemm", "dims": {"M": 8, "N": 16, "K": 32}, "dtype": "float16"}
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"model": "old", "calls": [{**gemm, "count": 3}]}))

    import_shapes("--trace", str(path))

    assert served_calls("old") == {("gemm", "M=8,N=16,K=32", "float16", 0): 3}


def test_a_bad_token_count_is_refused_naming_the_call(operators, tmp_path):
    path = tmp_path / "trace.json"
    path.write_text(
        json.dumps({"model": "m", "calls": [GOOD_CALL, {**GOOD_CALL, "tokens": -1}]})
    )
    with pytest.raises(CommandError, match="call 2: tokens must be an integer"):
        import_shapes("--trace", str(path))
    assert not Shape.objects.exists() and not ServedCall.objects.exists()


GOOD_CALL = {
    "operator": "gemm",
    "dims": {"M": 1, "N": 2, "K": 3},
    "dtype": "float16",
    "count": 1,
}


def test_a_shape_no_device_could_hold_is_refused_naming_the_limit(operators, tmp_path):
    from matrix.models import DeviceType
    from matrix.services import DEMO_DEVICE_TYPES

    for spec in DEMO_DEVICE_TYPES:
        DeviceType.objects.create(**spec)
    big = {"M": 200_000, "N": 200_000, "K": 200_000}  # 1.2e11 elements
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"model": "m", "calls": [{**GOOD_CALL, "dims": big}]}))
    with pytest.raises(
        CommandError,
        match=re.escape(
            "row 1 (gemm): M=200000,N=200000,K=200000 needs 320 GB for its inputs and "
            "two copies of its outputs; the largest device in the catalogue has 192 GB"
        ),
    ):
        import_shapes("--trace", str(path))
    assert Shape.objects.count() == 0
    # One an H200 holds (a 3e10-element gemm: 80 GB) is taken.
    held = {"M": 100_000, "N": 100_000, "K": 100_000}
    path.write_text(json.dumps({"model": "m", "calls": [{**GOOD_CALL, "dims": held}]}))
    import_shapes("--trace", str(path))
    assert Shape.objects.count() == 1


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "not JSON"),
        (json.dumps([GOOD_CALL]), "expected an object with a 'calls' list"),
        (json.dumps({"model": "m", "calls": []}), "no calls"),
        (
            json.dumps({"model": "m", "calls": [GOOD_CALL, {**GOOD_CALL, "count": 0}]}),
            "call 2: count",
        ),
        (
            json.dumps({"model": "m", "calls": [GOOD_CALL, {"operator": "gemm"}]}),
            "call 2 lacks dims",
        ),
        (
            json.dumps(
                {
                    "model": "m",
                    "calls": [GOOD_CALL, {**GOOD_CALL, "operator": "conv9d"}],
                }
            ),
            "row 2: unknown operator 'conv9d'",
        ),
        (
            json.dumps(
                {
                    "model": "m",
                    "calls": [GOOD_CALL, {**GOOD_CALL, "dims": {"M": 1, "N": 2}}],
                }
            ),
            "row 2 (gemm)",
        ),
        (
            json.dumps(
                {"model": "m", "calls": [GOOD_CALL, {**GOOD_CALL, "dtype": "float64"}]}
            ),
            "unknown dtype 'float64'",
        ),
        (json.dumps({"calls": [GOOD_CALL]}), "pass --name"),
        (
            json.dumps({"model": "m", "calls": [GOOD_CALL], "unmapped": 5}),
            "'unmapped' must be a list",
        ),
        (
            json.dumps(
                {
                    "model": "m",
                    "calls": [GOOD_CALL],
                    "unmapped": [{"op": "aten.conv2d", "reason": "no", "count": "3"}],
                }
            ),
            "unmapped 1: count must be an integer from 1 to 2147483647",
        ),
        (
            json.dumps({"model": "m", "calls": [{**GOOD_CALL, "count": 10**400}]}),
            "call 1: count must be an integer from 1 to 2147483647",
        ),
        (
            json.dumps(
                {
                    "model": "m",
                    "calls": [
                        GOOD_CALL,
                        {**GOOD_CALL, "dims": {"M": 10**30, "N": 2, "K": 3}},
                    ],
                }
            ),
            "row 2 (gemm): M must be at most 2147483647",
        ),
        (
            json.dumps(
                {
                    "model": "m",
                    "calls": [
                        {**GOOD_CALL, "dims": {"M": 2**20, "N": 2**20, "K": 2**20}}
                    ],
                }
            ),
            "row 1 (gemm): M=1048576,N=1048576,K=1048576 makes tensors of 3.3e+12 "
            "elements in all; at most 1.1e+12",
        ),
        (
            json.dumps({"model": "lab\u0000", "calls": [GOOD_CALL]}),
            "without NUL characters",
        ),
        ("[" * 100_000 + "]" * 100_000, "nests its JSON too deeply"),
    ],
)
def test_a_malformed_trace_is_refused_and_nothing_is_written(
    operators, tmp_path, text, message
):
    path = tmp_path / "trace.json"
    path.write_text(text)

    with pytest.raises(CommandError, match=re.escape(message)):
        import_shapes("--trace", str(path))

    assert Shape.objects.count() == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--profile", "llama-3-8b", "--tokens", "1,x"], "--tokens"),
        (["--profile", "llama-3-8b", "--tokens", "16,16"], "positive and distinct"),
        (
            ["--profile", "llama-3-8b", "--tokens", "99999999999999999999999"],
            "--tokens: .* at most 2147483647",
        ),
        (
            ["--profile", "llama-3-8b", "--tokens", "2147483647"],
            "llama-3-8b: row .* elements in all",
        ),
        (["--profile", "llama-3-8b", "--dtypes", "float64"], "unknown \\['float64'\\]"),
        (
            ["--profile", "llama-3-8b", "--dtypes", "float16,float16"],
            "--dtypes: each dtype once; repeated \\['float16'\\]",
        ),
        (["--profile", "llama-3-8b", "--tokens", ""], "--tokens: must not be empty"),
        (["--profile", "llama-3-8b", "--dtypes", " "], "--dtypes: must not be empty"),
        (["--trace", "t.json", "--name", ""], "--name: must not be empty"),
        (["--trace", ""], "--trace: must not be empty"),
        (["--profile", "llama-3-8b", "--name", "x"], "--name applies to --trace"),
        (["--trace", "t.json", "--tokens", "1"], "apply to --profile"),
        (["--trace", "/nonexistent/t.json"], "cannot read"),
    ],
)
def test_it_refuses_options_that_do_not_fit(operators, args, message):
    with pytest.raises(CommandError, match=message):
        import_shapes(*args)

    assert Shape.objects.count() == 0


def test_unmapped_calls_are_reported_summed_over_token_counts(operators, tmp_path):
    path = tmp_path / "trace.json"
    conv = {"op": "aten.convolution", "reason": "no TileLang operator"}
    unmapped = [{**conv, "count": 2, "tokens": 1}, {**conv, "count": 3, "tokens": 5}]
    path.write_text(
        json.dumps({"model": "m", "calls": [GOOD_CALL], "unmapped": unmapped})
    )

    output = import_shapes("--trace", str(path))

    assert (
        "  not imported: 5 call(s) of aten.convolution: no TileLang operator" in output
    )


def test_a_model_is_removed_and_the_shapes_it_alone_called_are_no_longer_served(
    operators,
):
    args = ("--tokens", "1", "--dtypes", "float16")
    import_shapes("--profile", "llama-3-8b", *args)
    import_shapes("--profile", "mixtral-8x7b", *args)
    gate_up = Shape.objects.get(dims_key="M=1,N=28672,K=4096", dtype="float16")
    assert gate_up.weight == 96
    mixtral_only = set(
        ServedCall.objects.filter(source="mixtral-8x7b")
        .exclude(
            shape__in=ServedCall.objects.filter(source="llama-3-8b").values("shape")
        )
        .values_list("shape_id", flat=True)
    )
    assert mixtral_only
    said = import_shapes("--remove", "mixtral-8x7b")
    assert f"{len(mixtral_only)} are no longer served" in said
    assert not ServedCall.objects.filter(source="mixtral-8x7b").exists()
    assert not Shape.objects.filter(pk__in=mixtral_only, served=True).exists()
    # The shape Llama calls too weighs Llama's calls alone.
    gate_up.refresh_from_db()
    assert gate_up.served and gate_up.weight == 32
    with pytest.raises(CommandError, match="no served model 'gpt-9'; imported: llama"):
        import_shapes("--remove", "gpt-9")
