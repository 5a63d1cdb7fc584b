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
from collections import Counter
from pathlib import Path

import pytest
from django.core.management import call_command
from django.urls import reverse

from matrix.gate.evidence import evidence_upgrades
from matrix.gate.manifest import manifest_for
from matrix.models import DeviceType, ValidationJob
from matrix.models.gate import UpgradeProposal
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


@pytest.fixture(scope="module")
def seeded_once(django_db_setup, django_db_blocker):
    """What `make seed` does, in its order, once for the module, in a
    transaction rolled back at its end. Each test runs in a savepoint inside
    it, so what one test decides is gone before the next, as when each
    seeded its own (4-5 s alone, 15-20 s a test under make test's load)."""
    from django.db import transaction

    from matrix.services import catalog_seed

    with django_db_blocker.unblock(), pytest.MonkeyPatch.context() as env:
        env.delenv("DJANGO_SUPERUSER_USERNAME", raising=False)
        env.setenv("DJANGO_SUPERUSER_PASSWORD", "admin-pass-123")
        with transaction.atomic():
            catalog_seed()
            run("evidence", "import", "--current-if-none", *DEMO)
            run("evidence", "import-sustained", str(SUSTAINED))
            run("ensure_admin")
            yield run("demo_upgrade", *DEMO)
            transaction.set_rollback(True)


@pytest.fixture
def seeded(seeded_once, db):
    """The seed's output; ``db`` after ``seeded_once`` opens the test's
    savepoint inside the module's transaction."""
    return seeded_once


# Before the first seeded test: the module's seed would be in its database.
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
    # The library's softmax was fixed after the H200 evidence (a row whose
    # first third is masked came out NaN): its 32 served cells are stale on
    # both toolchains, and the proposal plans them for an H200 runner. Every
    # other served cell is judged on the evidence alone.
    planned = ValidationJob.objects.filter(sweep__in=proposal.sweeps.all())
    assert planned.count() == 2 * 32
    assert set(planned.values_list("shape__operator__name", flat=True)) == {"softmax"}
    # Every cell green on both releases is marked code-changed or not: 38
    # generated byte-identical code, so no speed difference is called there.
    verdicts = Counter(
        proposal.diff_rows.filter(change="still_green").values_list(
            "speed_verdict", flat=True
        )
    )
    assert verdicts["same code"] == 38
    assert sum(verdicts.values()) == 164
    assert not proposal.diff_rows.filter(
        speed_verdict="same code", perf_step__gt=0
    ).exists()


def test_two_demo_reviewers_approve_with_the_passwords_printed_once(client, seeded):
    passwords = dict(SHOWN_ONCE.findall(seeded))
    assert set(passwords) == {"reviewer1", "reviewer2"}
    proposal = UpgradeProposal.objects.get()
    for n, (username, password) in enumerate(sorted(passwords.items()), start=1):
        sign_in(client, username, password)
        response = client.post(
            f"/upgrades/{proposal.pk}/decide/",
            {
                "decision": "approve",
                "comment": f"the vocabulary softmax ({n})",
                "confirm": "on",
            },
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


def test_the_upgrades_compile_errors_are_one_alert_fixed_on_candidate_bisected(
    client, seeded
):
    """The 24 served H200 cells that fail to compile on the current 0.1.13
    and pass on 0.1.15: one alert, "fixed on candidate", and a bisection
    that can only narrow (no runner hosts 0.1.14) and says who would need
    it."""
    from matrix.alerts.reads import fixed_on_candidate
    from matrix.models.alerts import Alert

    proposal = UpgradeProposal.objects.get()
    (alert,) = Alert.objects.all()
    assert (alert.kind, alert.status, alert.cell_count, alert.backends) == (
        "current",
        "compile_error",
        24,
        ["cuda"],
    )
    assert (alert.toolchain, alert.good_toolchain) == (
        proposal.baseline,
        proposal.candidate,
    )
    candidate = fixed_on_candidate([alert])[alert.pk]
    assert (candidate.toolchain, candidate.proposal) == (
        proposal.candidate.name,
        proposal.pk,
    )
    said = alert.bisection
    assert said["state"] == "narrowed" and not said["release"]
    (need,) = said["needs"]
    assert need.startswith(
        "TileLang 0.1.14 is not hosted by any online runner with NVIDIA H200 · "
        "sm_90a · cuda: lab host h200-lab (its results came as evidence files) "
        "would need it. Build it with `scripts/make-toolchain-venv 0.1.14 "
    )
    assert f"alert #{alert.pk} (24 cells): bisection #{said['id']}" in seeded
    client.force_login(proposal.proposer)
    body = client.get(reverse("alert", args=[alert.pk])).content.decode()
    assert "fixed on candidate " + proposal.candidate.name in body
    assert "Not tested: TileLang 0.1.14" in body
    # The Models and Gaps pages say so of each of its cells: the softmax
    # revision that failed passes on the candidate.
    fixed = (
        f"fixed on candidate {proposal.candidate.name} "
        f'(<a href="/upgrades/{proposal.pk}/">upgrade #{proposal.pk}</a>): '
        "the revision that failed here passes there"
    )
    models = client.get(reverse("models"), {"model": "llama-3-8b"})
    assert fixed in models.content.decode()
    gaps = client.get(reverse("gaps"), {"operator": "softmax"})
    assert gaps.content.decode().count(fixed) == alert.cell_count
    # Run again, the demo bisects nothing more.
    assert "bisection" not in run("demo_upgrade", *DEMO)

    # Both reviewers approve and the admin rolls 0.1.15 out: production
    # runs the release that passes, and the alert is fixed.
    from django.contrib.auth import get_user_model

    from matrix.gate.services import proposal_approve, proposal_rollout

    users = get_user_model().objects
    for name in ("reviewer1", "reviewer2"):
        proposal_approve(
            proposal=proposal, by=users.get(username=name), comment="the softmax"
        )
    proposal_rollout(proposal=proposal, by=proposal.proposer)
    proposal.refresh_from_db()
    assert proposal.state == "rolled_out"
    alert.refresh_from_db()
    assert (alert.state, alert.open_cells) == ("fixed", 0)
    assert fixed_on_candidate([alert]) == {}
    body = client.get(reverse("alert", args=[alert.pk])).content.decode()
    assert f"upgrade #{proposal.pk} rolled out: every cell passes on" in body


def test_a_cpu_ab_file_adds_its_own_upgrade(seeded):
    """Another lab's A/B (this project's CPU, both releases) opens a proposal
    of its own on the device type both validated."""
    run("evidence", "import", str(CPU_AB))
    out = run("demo_upgrade", *DEMO, str(CPU_AB))
    assert UpgradeProposal.objects.count() == 2
    cpu = UpgradeProposal.objects.exclude(device_types__model="H200").get()
    assert [str(dt) for dt in cpu.device_types.all()] == ["x86-64 CPU · c"]
    assert f"upgrade #{cpu.pk} opened" in out


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


def make_seed() -> str:
    """Every command of `make seed`, in its order, with what each prints."""
    out = io.StringIO()
    for args in (
        ("seed_demo",),
        ("import_shapes", "--profile", "mixtral-8x7b"),
        ("import_shapes", "--profile", "qwen2.5-7b"),
        ("evidence", "import", "--current-if-none", *DEMO),
        ("evidence", "import-sustained", str(SUSTAINED)),
        ("ensure_admin",),
        ("demo_upgrade", *DEMO),
    ):
        call_command(*args, stdout=out, stderr=out)
    return out.getvalue()


def test_make_run_again_after_decisions_changes_nothing_decided(client, seeded):
    """Two reviewers approve the upgrade and a kernel submitted for the CPU;
    a restart (`make run` again) keeps both decisions, the manifest and the
    audit log as they were, and prints no error."""
    from matrix.accounts.roles import KERNEL_AUTHOR
    from matrix.models import AuditEvent, KernelRevision, Operator
    from matrix.submissions import kernel_review, kernel_submit
    from tests.security.helpers import attack_source

    passwords = dict(SHOWN_ONCE.findall(seeded))
    proposal = UpgradeProposal.objects.get()
    for username, password in sorted(passwords.items()):
        sign_in(client, username, password)
        client.post(
            f"/upgrades/{proposal.pk}/decide/",
            {"decision": "approve", "comment": "right and fast", "confirm": "on"},
        )
    from django.contrib.auth.models import Group, User

    author = User.objects.get(username="admin")
    author.groups.add(Group.objects.get(name=KERNEL_AUTHOR))
    add = Operator.objects.get(name="elementwise_add")
    submission = kernel_submit(
        operator=add, source=attack_source("good_add"), author=author, backends=["c"]
    )
    kernel_review(
        revision=submission,
        by=User.objects.get(username="reviewer1"),
        approve=True,
        comment="fine on the CPU",
    )
    proposal.refresh_from_db()
    manifest = manifest_for(toolchain=proposal.candidate)["entries"]
    events = list(AuditEvent.objects.values_list("pk", flat=True))

    printed = make_seed()

    proposal.refresh_from_db()
    assert proposal.state == UpgradeProposal.State.APPROVED
    assert proposal.approvals.filter(decision="approve").count() == 2
    assert manifest_for(toolchain=proposal.candidate)["entries"] == manifest
    assert add.current_revision("c") == submission
    assert add.current_revision("cuda").origin == KernelRevision.Origin.LIBRARY
    # Nobody decided anything: no audit event was written either.
    assert list(AuditEvent.objects.values_list("pk", flat=True)) == events
    assert "error" not in printed.lower(), printed


def test_the_demo_softmax_evidence_stays_on_the_revision_it_ran_and_says_so(
    client, seeded
):
    """The H200 evidence ran softmax revision 6e6b1365893b; the library's
    softmax changed after it (masked rows, ea077e6), so its 32 served cells
    on each toolchain are stale and their page names both revisions. Every
    other operator's evidence ran the revision current now."""
    from matrix import revisions
    from matrix.models import Cell, Shape
    from runners.kernels.revision import library_sha256

    h200 = DeviceType.objects.get(model="H200")
    current = revisions.current_map()
    cells = Cell.objects.filter(device_type=h200).select_related(
        "revision", "toolchain", "shape__operator"
    )
    stale = Counter(
        (c.shape.operator.name, c.toolchain.tilelang_version, c.revision.source_sha256)
        for c in cells
        if current.get((c.shape.operator_id, "cuda")) != c.revision_id
    )
    ran = "6e6b1365893b"
    assert {(op, tl, sha[:12]): n for (op, tl, sha), n in stale.items()} == {
        ("softmax", "0.1.13", ran): 32,
        ("softmax", "0.1.15", ran): 32,
    }
    now = library_sha256("softmax")
    assert not now.startswith(ran)
    shape = Shape.objects.get(
        operator__name="softmax", dims_key="M=1,N=8", dtype="float16"
    )
    page = client.get(reverse("cell", args=[shape.pk, h200.pk])).content.decode()
    assert (
        f"it ran kernel revision <code>{ran}</code>, and the one current on CUDA is "
        f"<code>{now[:12]}</code> (library)"
    ) in page


def test_approved_by_the_demo_reviewers_it_exports_the_committed_h200_manifest(
    seeded, tmp_path
):
    """What scripts/demo-manifest does after the seed: the committed
    manifest a GPU run of bench/serve_model.py reads is the demo's."""
    assert "upgrade #" in run("demo_upgrade", "--approve", *DEMO)
    proposal = UpgradeProposal.objects.get()
    assert proposal.state == UpgradeProposal.State.APPROVED
    assert proposal.approvals.filter(decision="approve").count() == 2
    out = tmp_path / "manifest.json"
    h200 = "NVIDIA H200 · sm_90a · cuda"
    call_command(
        "export_manifest",
        "--toolchain",
        proposal.candidate.name,
        "--device-type",
        h200,
        "--out",
        str(out),
        stderr=io.StringIO(),
    )
    exported = json.loads(out.read_text())
    committed = json.loads(
        (EVIDENCE / "2026-12-06-h200-manifest-tilelang-0.1.15.json").read_text()
    )
    assert exported["toolchain"] == committed["toolchain"]

    def rows(manifest):  # the proposal's id is the database's
        return sorted(
            json.dumps({k: v for k, v in e.items() if k != "proposal"}, sort_keys=True)
            for e in manifest["entries"]
        )

    assert len(exported["entries"]) == 188
    assert rows(exported) == rows(committed)
    assert {e["device_type"] for e in exported["entries"]} == {h200}
