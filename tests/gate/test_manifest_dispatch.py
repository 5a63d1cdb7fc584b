"""From approval to production dispatch: the manifest over HTTP and from the
command, read by runners.dispatch without Django."""

from __future__ import annotations

import hashlib
import io
import json
import logging
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from matrix.gate.services import proposal_approve, proposal_open, proposal_rollout
from matrix.models import Status
from runners.dispatch import (
    FORMAT,
    Dispatcher,
    device_type_label,
    host_toolchain_fingerprint,
    library_revisions,
)

CPU = "x86-64 CPU · c"


@pytest.fixture
def approved(world):
    world.green(world.old)
    world.record("softmax", world.cpu, world.new, Status.PASS)
    world.record("gemm", world.cpu, world.new, Status.PASS)
    # Validated, but not green: the manifest must route it to the reference.
    world.record("unserved", world.cpu, world.old, Status.COMPILE_ERROR)
    world.record("unserved", world.cpu, world.new, Status.MISMATCH)
    proposal = proposal_open(
        baseline=world.old,
        candidate=world.new,
        device_types=[world.cpu],
        by=world.owner,
    )
    proposal_approve(proposal=proposal, by=world.reviewers[0], comment="clean")
    proposal_approve(proposal=proposal, by=world.reviewers[1], comment="agreed")
    return proposal


def test_the_api_serves_the_approved_table(client, world, approved):
    response = client.get("/api/v1/manifest", {"toolchain": "tilelang-0.1.15"})
    assert response.status_code == 200
    body = response.json()
    assert body["toolchain"]["fingerprint"] == world.new.fingerprint
    table = {
        (e["operator"], e["dtype"], e["device_type"], json.dumps(e["shape_rule"])): (
            e["choice"],
            e["kernel_sha256"],
        )
        for e in body["entries"]
    }
    softmax_sha = world.shapes["softmax"].operator.current_revision("c").source_sha256
    assert table == {
        ("gemm", "float32", CPU, '{"dims": {"M": 64, "N": 64, "K": 64}}'): (
            "tilelang",
            world.shapes["gemm"].operator.current_revision("c").source_sha256,
        ),
        ("softmax", "float32", CPU, '{"dims": {"M": 64, "N": 256}}'): (
            "tilelang",
            softmax_sha,
        ),
        ("softmax", "float32", CPU, '{"dims": {"M": 7, "N": 33}}'): (
            "reference",
            softmax_sha,
        ),
    }


def test_an_unapproved_toolchain_has_an_empty_table(client, world, approved):
    body = client.get("/api/v1/manifest", {"toolchain": world.old.fingerprint}).json()
    assert body["entries"] == []
    assert client.get("/api/v1/manifest", {"toolchain": "nope"}).status_code == 404


def test_dispatch_uses_tilelang_only_where_validated(world, approved, tmp_path, caplog):
    out = tmp_path / "manifest.json"
    call_command("export_manifest", "--toolchain", "tilelang-0.1.15", "--out", str(out))
    dispatcher = Dispatcher.from_file(
        out, device_type=CPU, toolchain_fingerprint=world.new.fingerprint
    )

    class Tensor:
        shape = (64, 256)

    calls = []

    def run(shape, dtype="float32"):
        return dispatcher.call(
            "softmax",
            shape,
            dtype,
            tilelang=lambda x: calls.append("tilelang"),
            reference=lambda x: calls.append("reference"),
            args=(Tensor(),),
        )

    caplog.set_level(logging.INFO, logger="tilematrix.dispatch")
    run({"M": 64, "N": 256})
    run({"N": 256, "M": 64})
    assert calls == ["tilelang", "tilelang"]
    assert caplog.records == []

    run({"M": 128, "N": 256})
    run({"M": 7, "N": 33})
    run({"M": 64, "N": 256}, dtype="float16")
    assert calls[2:] == ["reference"] * 3
    messages = [r.getMessage() for r in caplog.records]
    assert messages[0] == (
        "reference fallback for softmax float32 dims={'M': 128, 'N': 256} "
        "arg_shapes=[(64, 256)] on x86-64 CPU · c: softmax float32 shape "
        "{'M': 128, 'N': 256} has no approved entry for x86-64 CPU · c"
    )
    assert messages[1].endswith(": mismatch on tilelang-0.1.15")
    assert "no approved entry" in messages[2]


def test_a_hosts_own_device_type_file_decides_as_the_whole_table(
    world, approved, tmp_path
):
    whole, own = tmp_path / "whole.json", tmp_path / "own.json"
    call_command(
        "export_manifest", "--toolchain", "tilelang-0.1.15", "--out", str(whole)
    )
    call_command(
        "export_manifest",
        "--toolchain",
        "tilelang-0.1.15",
        "--device-type",
        CPU,
        "--out",
        str(own),
    )
    assert (
        json.loads(own.read_text())["entries"]
        == json.loads(whole.read_text())["entries"]
    )
    h200 = tmp_path / "h200.json"
    call_command(
        "export_manifest",
        "--toolchain",
        "tilelang-0.1.15",
        "--device-type",
        str(world.h200),
        "--out",
        str(h200),
    )
    assert json.loads(h200.read_text())["entries"] == []
    with pytest.raises(CommandError, match="no device type named 'H100'; known: "):
        call_command("export_manifest", "--device-type", "H100")


def test_dispatch_falls_back_on_another_device_or_toolchain(world, approved, tmp_path):
    out = tmp_path / "manifest.json"
    call_command("export_manifest", "--toolchain", "tilelang-0.1.15", "--out", str(out))
    dims = {"M": 64, "N": 256}
    h200 = Dispatcher.from_file(
        out,
        device_type="NVIDIA H200 · sm_90a · cuda",
        toolchain_fingerprint=world.new.fingerprint,
    )
    decision = h200.decide("softmax", dims, "float32")
    assert (decision.choice, decision.reason) == (
        "reference",
        "device type 'NVIDIA H200 · sm_90a · cuda' was never validated",
    )
    old = Dispatcher.from_file(
        out, device_type=CPU, toolchain_fingerprint=world.old.fingerprint
    )
    decision = old.decide("softmax", dims, "float32")
    assert decision.choice == "reference"
    assert decision.reason == (
        f"toolchain {world.old.fingerprint[:12]} is not the one validated "
        f"(tilelang-0.1.15 {world.new.fingerprint[:12]})"
    )


def test_dispatch_imports_without_django(world, approved, tmp_path):
    out = tmp_path / "manifest.json"
    call_command("export_manifest", "--toolchain", "tilelang-0.1.15", "--out", str(out))
    script = (
        "import sys, runners.dispatch as d\n"
        "assert not any(m == 'django' or m.startswith('django.') for m in sys.modules)\n"
        f"x = d.Dispatcher.from_file({str(out)!r}, device_type={CPU!r},"
        f" toolchain_fingerprint={world.new.fingerprint!r})\n"
        "print(x.decide('gemm', {'M': 64, 'N': 64, 'K': 64}, 'float32').choice)\n"
    )
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=root, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "tilelang"


def exported(tmp_path) -> dict:
    out = tmp_path / "manifest.json"
    call_command("export_manifest", "--toolchain", "tilelang-0.1.15", "--out", str(out))
    return json.loads(out.read_text())


def test_dispatch_runs_tilelang_only_for_the_kernel_revision_validated(
    world, approved, tmp_path
):
    manifest = exported(tmp_path)
    validated = hashlib.sha256(b"softmax").hexdigest()  # the world's revision
    dims = {"M": 64, "N": 256}

    def decide(revisions):
        return Dispatcher(
            manifest,
            device_type=CPU,
            toolchain_fingerprint=world.new.fingerprint,
            kernel_revisions=revisions,
        ).decide("softmax", dims, "float32")

    assert decide({"softmax": validated}).choice == "tilelang"
    edited = decide({"softmax": "e" * 64})
    assert (edited.choice, edited.reason) == (
        "reference",
        f"softmax's kernel here (eeeeeeeeeeee) is not the revision validated "
        f"({validated[:12]})",
    )
    assert decide({"gemm": validated}).reason == (
        "no kernel revision of softmax is given here"
    )


def test_library_revisions_are_named_as_the_catalogue_names_them(db):
    from matrix.services import operator_sync_library

    for op in operator_sync_library():
        assert library_revisions(op.name) == {
            op.name: op.current_revision("c").source_sha256
        }
    with pytest.raises(ValueError, match="no library operator named 'conv'"):
        library_revisions("conv")


def test_a_fallback_is_logged_once_per_operator_dtype_and_dims(
    world, approved, tmp_path, caplog
):
    dispatcher = Dispatcher(
        exported(tmp_path), device_type=CPU, toolchain_fingerprint=world.new.fingerprint
    )
    caplog.set_level(logging.INFO, logger="tilematrix.dispatch")
    outputs = [
        dispatcher.call(
            "softmax", dims, "float32", tilelang=lambda: "tl", reference=lambda: "ref"
        )
        for dims in [{"M": 128, "N": 256}] * 3 + [{"M": 256, "N": 256}]
    ]
    assert outputs == ["ref"] * 4
    first, second = (r.getMessage() for r in caplog.records)
    assert "dims={'M': 128, 'N': 256}" in first
    assert "dims={'M': 256, 'N': 256}" in second


@pytest.mark.parametrize(
    ("manifest", "refusal"),
    [
        ({"format": "csv"}, "not a tilematrix-manifest/1 manifest: 'csv'"),
        ({"format": FORMAT}, "the manifest names no toolchain fingerprint"),
        (
            {"format": FORMAT, "toolchain": {"fingerprint": "f"}, "entries": {}},
            "the manifest's entries must be a list",
        ),
        (
            {
                "format": FORMAT,
                "toolchain": {"fingerprint": "f"},
                "entries": [{"operator": "gemm", "dtype": "float16"}],
            },
            "manifest entry 0 lacks device_type, shape_rule, choice",
        ),
        (
            {
                "format": FORMAT,
                "toolchain": {"fingerprint": "f"},
                "entries": [
                    {
                        "operator": "gemm",
                        "dtype": "float16",
                        "device_type": CPU,
                        "shape_rule": {"dims": {"M": "many"}},
                        "choice": "tilelang",
                    }
                ],
            },
            "manifest entry 0: shape_rule.dims must map dims to ints",
        ),
    ],
)
def test_a_malformed_manifest_is_refused_in_words(manifest, refusal):
    with pytest.raises(ValueError) as refused:
        Dispatcher(manifest, device_type=CPU, toolchain_fingerprint="f")
    assert str(refused.value) == refusal


def test_export_defaults_to_the_current_toolchain_after_rollout(
    world, approved, capsys
):
    call_command("export_manifest")
    assert json.loads(capsys.readouterr().out)["toolchain"]["name"] == "tilelang-0.1.13"
    proposal_rollout(proposal=approved, by=world.reviewers[2])
    call_command("export_manifest")
    manifest = json.loads(capsys.readouterr().out)
    assert manifest["toolchain"]["name"] == "tilelang-0.1.15"
    assert len(manifest["entries"]) == 3


def test_a_host_fingerprints_its_toolchain_as_registering_it_would(catalog, tmp_path):
    """A production host running the interpreter a runner validated with
    reads that toolchain's manifest: the fingerprints are the same."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from matrix.fleet import services
    from runners import signing
    from runners.host import inventory_probe

    runner = services.runner_register(
        token=services.token_create(expires=timedelta(minutes=5)),
        name="validated-here",
        public_key=signing.public_key_hex(Ed25519PrivateKey.generate()),
        inventory=inventory_probe([sys.executable]),
    )
    services.runner_approve(name=runner.name)
    registered = runner.toolchains.get()
    assert host_toolchain_fingerprint(str(tmp_path)) == registered.fingerprint
    assert registered.tilelang_version == "0.1.15"


def test_a_host_names_its_device_type_as_the_manifest_does(world):
    for dt in (world.cpu, world.h200):
        assert device_type_label(
            vendor=dt.vendor, model=dt.model, arch=dt.arch, backend=dt.backend
        ) == str(dt)


def test_the_manifest_is_in_the_openapi_schema(client, db):
    schema = client.get("/api/v1/openapi.json").json()
    operation = schema["paths"]["/api/v1/manifest"]["get"]
    assert [p["name"] for p in operation["parameters"]] == ["toolchain", "device_type"]
    # A production host told "no such toolchain" can tell it from a bug, and
    # one that holds the manifest already gets a 304.
    assert set(operation["responses"]) == {"200", "304", "404", "422"}


def test_an_empty_export_says_where_the_approved_manifests_are(world, approved):
    # The baseline is still current after the approval: its manifest is
    # empty, and the command says so rather than writing 0 entries silently.
    out, err = io.StringIO(), io.StringIO()
    call_command(
        "export_manifest", "--toolchain", world.old.name, stdout=out, stderr=err
    )
    assert json.loads(out.getvalue())["entries"] == []
    said = err.getvalue()
    assert f"no approved entries for {world.old.name}" in said
    assert "approved manifests exist for: tilelang-0.1.15" in said
