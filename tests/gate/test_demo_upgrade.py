"""`make run`'s upgrade: the H200 lab's A/B evidence imported (TileLang 0.1.13
and 0.1.15 on the served shapes, as the Makefile's DEMO_EVIDENCE), a proposal
opened on it that two demo reviewers can approve, and nothing twice on a
second run."""

from __future__ import annotations

import hashlib
import io
import json
import re
import sys
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
# What `make seed` imports (the Makefile's DEMO_EVIDENCE).
DEMO = [str(p) for p in sorted(EVIDENCE.glob("*-h200-*.evidence.json"))]
CPU_AB = EVIDENCE / "2026-12-02-cpu-ab-tilelang-0.1.13-0.1.15.evidence.json"
# The Makefile's DEMO_SUSTAINED: decode gemm at the power cap, on 0.1.15.
SUSTAINED = EVIDENCE / "2026-12-03-h200-sustained-speed-decode.json"
SHOWN_ONCE = re.compile(r"reviewer account: (reviewer\d) / (\S+)  \(shown once\)")


def report_served(version: str) -> dict:
    """What ``bench/h200_report.py`` writes in the served column of the
    report on the candidate's evidence file, per cell."""
    sys.path.insert(0, str(EVIDENCE.parents[1] / "bench"))
    from h200_report import served, sustained_speeds

    (path,) = EVIDENCE.glob(f"*-h200-ab-tilelang-{version}.evidence.json")
    data = json.loads(path.read_text())
    at_cap = sustained_speeds(json.loads(SUSTAINED.read_text()))
    jobs = {job["job"]: job for job in data["jobs"]}
    cells = {}
    for envelope in data["results"]:
        job = jobs[envelope["payload"]["job"]]
        key = (job["operator"], json.dumps(job["dims"], sort_keys=True), job["dtype"])
        cells[key] = served(envelope["payload"]["result"], at_cap.get(key)).lower()
    return cells


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
    run("evidence", "import", "--current-if-none", *DEMO)
    run("evidence", "import-sustained", str(SUSTAINED))
    run("ensure_admin")
    return run("demo_upgrade", *DEMO)


def test_the_demo_opens_an_upgrade_ready_for_a_decision(seeded):
    proposal = UpgradeProposal.objects.get()
    assert (
        proposal.baseline.tilelang_version,
        proposal.candidate.tilelang_version,
    ) == (
        "0.1.13",
        "0.1.15",
    )
    assert [str(dt) for dt in proposal.device_types.all()] == [
        "NVIDIA H200 · sm_90a · cuda"
    ]
    assert proposal.proposer.username == "admin"
    assert proposal.state == UpgradeProposal.State.READY, proposal.blocking_reasons
    assert f"upgrade #{proposal.pk} opened" in seeded
    # Real evidence on both sides: the vocabulary softmax launches a
    # thread-block cluster, which only 0.1.15 compiles.
    summary = proposal.summary
    assert (summary["served"], summary["red_to_green"], summary["missing"]) == (
        188,
        24,
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
            {"decision": "approve", "comment": f"the vocabulary softmax ({n})"},
        )
        assert response.status_code == 302
    proposal.refresh_from_db()
    assert proposal.state == UpgradeProposal.State.APPROVED
    entries = manifest_for(toolchain=proposal.candidate)["entries"]
    assert len(entries) == 188
    # Right and fast: TileLang where it passed at the reference's speed or
    # better, the reference (saying how much slower) where it only passed.
    fast = [e for e in entries if e["choice"] == "tilelang"]
    slower = [e for e in entries if e["choice"] == "reference"]
    assert fast and slower
    assert all(
        re.search(r"but [\d.]+× (of the reference|at the power cap)", e["reason"])
        for e in slower
    )
    # Three decode cells the harness timed as faster are slower at the power
    # cap: the reference is served there.
    at_cap = sorted(
        (e["dtype"], e["shape_rule"]["dims"]["N"])
        for e in slower
        if "at the power cap" in e["reason"]
    )
    assert at_cap == [("bfloat16", 4608), ("bfloat16", 37888), ("float16", 37888)]
    # The candidate's evidence report names the same choice for every cell.
    assert report_served(proposal.candidate.tilelang_version) == {
        (
            e["operator"],
            json.dumps(e["shape_rule"]["dims"], sort_keys=True),
            e["dtype"],
        ): e["choice"]
        for e in entries
    }
    # The admin proposed it, so cannot decide on it.
    sign_in(client, "admin", "admin-pass-123")
    response = client.post(
        f"/upgrades/{proposal.pk}/decide/", {"decision": "reject", "comment": "mine"}
    )
    assert response.status_code == 403


def test_a_second_run_opens_nothing_and_prints_no_password(seeded):
    again = run("demo_upgrade", *DEMO)
    assert UpgradeProposal.objects.count() == 1
    assert not SHOWN_ONCE.search(again)
    assert "reviewer account 'reviewer1' exists" in again
    assert re.search(r"upgrade #\d+ \(.*\) exists: ready", again)


def test_a_cpu_ab_file_adds_its_own_upgrade(seeded):
    """Another lab's A/B (this project's CPU, both releases) opens a proposal
    of its own on the device type both validated."""
    run("evidence", "import", str(CPU_AB))
    out = run("demo_upgrade", *DEMO, str(CPU_AB))
    assert UpgradeProposal.objects.count() == 2
    cpu = UpgradeProposal.objects.exclude(device_types__model="H200").get()
    assert [str(dt) for dt in cpu.device_types.all()] == ["x86-64 CPU · c"]
    assert f"upgrade #{cpu.pk} opened" in out


def test_the_cells_a_lab_only_lowered_are_no_ab(catalog):
    """Only a device type validated under both releases makes an upgrade."""
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
    assert [str(u) for u in evidence_upgrades({"jobs": jobs})] == [
        f"h200-tilelang-0.1.13 → h200-tilelang-0.1.15 on {h200}"
    ]


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
