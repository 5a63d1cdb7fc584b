"""bench/serve_model.py reads the manifest the server exported from the demo's
H200 evidence (docs/evidence, written by scripts/demo-manifest): its cuda
cells route on an H200 with the toolchain it validated, and on this CPU
they serve nothing, the model running as if no router were there."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
os.environ.setdefault("TILELANG_CACHE_DIR", str(REPO / "var" / "tilelang-cache-tests"))
sys.path.insert(0, str(REPO / "bench"))

import serve_model  # noqa: E402

from runners.dispatch import TILELANG  # noqa: E402
from runners.serve import Router  # noqa: E402

MANIFEST = REPO / "docs" / "evidence" / "2026-12-06-h200-manifest-tilelang-0.1.15.json"
H200 = "NVIDIA H200 · sm_90a · cuda"


@pytest.fixture(scope="module")
def manifest():
    return json.loads(MANIFEST.read_text())


def test_the_h200_manifest_routes_its_approved_cells_on_its_own_toolchain(manifest):
    router = Router.from_manifest(
        manifest,
        target={"kind": "cuda", "arch": "sm_90a"},
        device_type=H200,
        toolchain_fingerprint=manifest["toolchain"]["fingerprint"],
    )
    assert not router.idle
    decide = router.dispatcher.decide
    served = {
        (op, json.dumps(dims, sort_keys=True), dtype)
        for op, dims, dtype in router.dispatcher.tilelang_cells()
    }
    approved = [e for e in manifest["entries"] if e["choice"] == TILELANG]
    # Every TileLang entry serves, but softmax: its kernel was fixed for
    # masked rows after this evidence, so its revision here is another.
    for entry in approved:
        key = (
            entry["operator"],
            json.dumps(entry["shape_rule"]["dims"], sort_keys=True),
            entry["dtype"],
        )
        if entry["operator"] == "softmax":
            reason = decide(
                entry["operator"], entry["shape_rule"]["dims"], entry["dtype"]
            )
            assert "is not the revision validated" in reason.reason
            assert key not in served
        else:
            assert key in served
    slower = next(e for e in manifest["entries"] if e["choice"] != TILELANG)
    assert (
        decide(slower["operator"], slower["shape_rule"]["dims"], slower["dtype"]).reason
        == slower["reason"]
    )


def test_the_bench_takes_it_on_the_cpu_and_serves_nothing_there(tmp_path):
    out = tmp_path / "serve.json"
    argv = ["--smoke", "--manifest", str(MANIFEST), "--assume-toolchain"]
    argv += ["--models", "tinyllama-1.1b", "--batches", "1", "--rounds", "1"]
    assert serve_model.main([*argv, "--reps", "1", "--out", str(out)]) == 0
    document = json.loads(out.read_text())
    assert document["manifest"] == str(MANIFEST)
    assert document["device_type"] == H200
    assert document["manifest_toolchain"]["name"] == "tilelang-0.1.15-e6efb837"
    assert document["toolchain_assumed"] is True
    assert document["wrong"] == []
    [model] = document["models"]
    assert model["serving_nothing"] == (
        f"{H200} was validated on another backend than this router's target, c"
    )
    assert model["approved_here"] == 0
    for step in model["steps"]:
        assert step["report"]["by_operator"] == []
        assert step["output"]["rel_err"] == 0.0
