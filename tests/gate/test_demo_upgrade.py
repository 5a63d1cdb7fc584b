"""`make run`'s upgrade: the CPU A/B evidence imported, a proposal opened on
it that two demo reviewers can approve, and nothing twice on a second run."""

from __future__ import annotations

import hashlib
import io
import json
import re
from pathlib import Path

import pytest
from django.core.management import call_command
from django.urls import reverse

from matrix.gate.evidence import evidence_upgrades
from matrix.gate.manifest import manifest_for
from matrix.gate.models import UpgradeProposal
from matrix.models import DeviceType
from matrix.services import toolchain_register

EVIDENCE = Path(__file__).resolve().parents[2] / "docs" / "evidence"
CPU_AB = EVIDENCE / "2026-12-02-cpu-ab-tilelang-0.1.13-0.1.15.evidence.json"
SHOWN_ONCE = re.compile(r"reviewer account: (reviewer\d) / (\S+)  \(shown once\)")


def sign_in(client, username: str, password: str) -> None:
    """Through the login form, as a person would with what was printed."""
    client.logout()
    response = client.post(
        reverse("login"), {"username": username, "password": password}
    )
    assert response.status_code == 302, f"{username} could not sign in"


def run(*args) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


@pytest.fixture
def seeded(catalog, monkeypatch):
    """What `make seed` does, in its order."""
    monkeypatch.delenv("DJANGO_SUPERUSER_USERNAME", raising=False)
    monkeypatch.setenv("DJANGO_SUPERUSER_PASSWORD", "admin-pass-123")
    run("evidence", "import", "--current-if-none", str(CPU_AB))
    run("ensure_admin")
    return run("demo_upgrade", str(CPU_AB))


def test_the_demo_opens_an_upgrade_ready_for_a_decision(seeded):
    proposal = UpgradeProposal.objects.get()
    assert (
        proposal.baseline.tilelang_version,
        proposal.candidate.tilelang_version,
    ) == (
        "0.1.13",
        "0.1.15",
    )
    assert [str(dt) for dt in proposal.device_types.all()] == ["x86-64 CPU · c"]
    assert proposal.proposer.username == "admin"
    assert proposal.state == UpgradeProposal.State.READY, proposal.blocking_reasons
    assert f"upgrade #{proposal.pk} opened" in seeded
    # Real evidence on both sides: softmax compiles on c only with 0.1.15.
    summary = proposal.summary
    assert (summary["served"], summary["red_to_green"], summary["missing"]) == (
        188,
        2,
        0,
    )
    assert not proposal.sweeps.exists()


def test_two_demo_reviewers_approve_with_the_passwords_printed_once(client, seeded):
    passwords = dict(SHOWN_ONCE.findall(seeded))
    assert set(passwords) == {"reviewer1", "reviewer2"}
    proposal = UpgradeProposal.objects.get()
    for n, (username, password) in enumerate(sorted(passwords.items()), start=1):
        sign_in(client, username, password)
        response = client.post(
            f"/upgrades/{proposal.pk}/decide/",
            {"decision": "approve", "comment": f"softmax compiles on c ({n})"},
        )
        assert response.status_code == 302
    proposal.refresh_from_db()
    assert proposal.state == UpgradeProposal.State.APPROVED
    entries = manifest_for(toolchain=proposal.candidate)["entries"]
    served = [e for e in entries if e["dtype"] != "float32"]
    assert len(served) == 188
    assert {e["choice"] for e in served} == {"reference"}
    assert {e["reason"] for e in served} == {
        f"unsupported on {proposal.candidate.name}"
    }
    # The admin proposed it, so cannot decide on it.
    sign_in(client, "admin", "admin-pass-123")
    response = client.post(
        f"/upgrades/{proposal.pk}/decide/", {"decision": "reject", "comment": "mine"}
    )
    assert response.status_code == 403


def test_a_second_run_opens_nothing_and_prints_no_password(seeded):
    again = run("demo_upgrade", str(CPU_AB))
    assert UpgradeProposal.objects.count() == 1
    assert not SHOWN_ONCE.search(again)
    assert "reviewer account 'reviewer1' exists" in again
    assert re.search(r"upgrade #\d+ \(.*\) exists: ready", again)


def test_a_gpu_ab_file_adds_its_own_upgrade(seeded, tmp_path):
    """A later evidence file from a GPU lab running both releases opens a
    proposal of its own on the device type both validated; the cells it
    only lowered elsewhere are no A/B."""
    h200 = DeviceType.objects.get(model="H200")
    old, new = (
        toolchain_register(
            name=f"h200-tilelang-{version}", components={"tilelang": version}
        )
        for version in ("0.1.13", "0.1.15")
    )
    jobs = [
        job(1, h200, old, "validate"),
        job(2, h200, new, "validate"),
        job(3, DeviceType.objects.get(backend="hip"), new, "lower"),
    ]
    gpu_file = tmp_path / "2026-12-03-h200-ab.evidence.json"
    gpu_file.write_text(json.dumps({"jobs": jobs}))
    assert [str(u) for u in evidence_upgrades({"jobs": jobs})] == [
        f"h200-tilelang-0.1.13 → h200-tilelang-0.1.15 on {h200}"
    ]
    out = run("demo_upgrade", str(CPU_AB), str(gpu_file))
    assert UpgradeProposal.objects.count() == 2
    gpu = UpgradeProposal.objects.get(candidate=new)
    assert list(gpu.device_types.all()) == [h200]
    assert f"upgrade #{gpu.pk} opened" in out


def job(n, device_type, toolchain, stage) -> dict:
    return {
        "job": n,
        "operator": "gemm",
        "stage": stage,
        "toolchain": toolchain.fingerprint,
        "revision": hashlib.sha256(b"gemm").hexdigest(),
        "device": {
            "vendor": device_type.vendor,
            "model": device_type.model,
            "arch": device_type.arch,
            "backend": device_type.backend,
        },
    }
