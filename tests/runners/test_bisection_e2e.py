"""Bisection and alerts in a deployment of real processes: the web server,
the control worker and a CPU runner worker (`python -m runners work`)
hosting TileLang 0.1.13, 0.1.14 and 0.1.15, with the real sandboxed
harness. Each job goes through the broker to the runner; its result comes
back through ingest in the control worker, whose receivers open alerts,
plan a bisection's next step and write its conclusion onto the alert. The
control worker's Celery tasks mail a real SMTP server (aiosmtpd) and post
to a real HTTP receiver, both in this process.

The deployment, its runner and the two receivers are shared by the module's
tests: the alert test runs last, since it leaves a submitted softmax
current on the CPU backend."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from matrix.notifications.channels import signature_valid
from tests.alerts.conftest import hook_server, smtp_server
from tests.gate.test_bisection_cpu import interpreter

from .cluster import RUNNER_ENV, Cluster

RUNNER = "cpu-bisect"
# A softmax that lowers on every release (no tl.infinity), submitted and
# approved: the served cell passes with it on 0.1.13.
FINITE_SOFTMAX = (
    Path(__file__).resolve().parents[1] / "harness" / "submitted" / "finite_softmax.py"
)
START = """
from matrix.bisection.services import bisection_start
from matrix.models import DeviceType, Operator, Shape, Toolchain
softmax = Operator.objects.get(name="softmax")
shape, _ = Shape.objects.get_or_create(
    operator=softmax, dims_key="M=64,N=256", dtype="float32",
    defaults={"dims": {"M": 64, "N": 256}, "served": True, "weight": 1.0},
)
hosted = Toolchain.objects.filter(runners__name="cpu-bisect")
bisection = bisection_start(
    shape=shape,
    device_type=DeviceType.objects.get(backend="c"),
    last_good=hosted.get(tilelang_version="0.1.15"),
    first_bad=hosted.get(tilelang_version="0.1.13"),
)
print(bisection.pk)
"""


@pytest.fixture(scope="module")
def mail():
    with smtp_server() as (inbox, port):
        yield inbox, port


@pytest.fixture(scope="module")
def hooks():
    with hook_server() as received:
        yield received


@pytest.fixture(scope="module")
def cluster(mail):
    _, port = mail
    cluster = Cluster()
    try:
        cluster.start_web()
        cluster.start_control(
            DJANGO_EMAIL_BACKEND="django.core.mail.backends.smtp.EmailBackend",
            EMAIL_HOST="127.0.0.1",
            EMAIL_PORT=str(port),
            TILEMATRIX_BASE_URL=cluster.server,
        )
        yield cluster
    finally:
        cluster.close()


@pytest.fixture(scope="module")
def runner(cluster):
    """The CPU runner worker, hosting the three releases."""
    token = cluster.manage("runner", "token", "create", "--expires", "10m")
    pythons = [
        interpreter("0.1.13"),
        interpreter("0.1.14"),
        os.path.abspath(sys.executable),
    ]
    cluster.manage(
        "runner",
        "register",
        "--server",
        cluster.server,
        "--token",
        token.stdout.strip().splitlines()[-1],
        "--name",
        RUNNER,
        "--key-dir",
        str(cluster.key_dir(RUNNER)),
        *(arg for python in pythons for arg in ("--python", python)),
        env=RUNNER_ENV,
    )
    cluster.manage("runner", "approve", RUNNER)
    cluster.start_runner(RUNNER, TILEMATRIX_HARNESS="runners.harness.sandbox")
    cluster.wait(
        lambda: cluster.runner_state(RUNNER) == "online",
        timeout=90,
        what=f"{RUNNER} online",
    )
    return RUNNER


def test_a_runner_worker_runs_each_step_and_the_first_good_release_is_named(
    cluster, runner
):
    started = cluster.manage("shell", "-c", START).stdout.strip().splitlines()[-1]
    bisection = int(started)
    cluster.wait(
        lambda: (
            cluster.sql(
                "SELECT state FROM matrix_bisection WHERE id = ?", (bisection,)
            )[0][0]
            != "running"
        ),
        timeout=300,
        what=f"bisection {bisection} to end",
    )
    ((state, conclusion, release),) = cluster.sql(
        "SELECT b.state, b.conclusion, t.tilelang_version FROM matrix_bisection b "
        "LEFT JOIN matrix_toolchain t ON t.id = b.release_id WHERE b.id = ?",
        (bisection,),
    )
    assert (state, release) == ("found", "0.1.15"), conclusion
    assert conclusion.startswith("First good release: TileLang 0.1.15 ")
    steps = cluster.sql(
        "SELECT t.tilelang_version, s.status, s.reused, j.state FROM "
        "matrix_bisectionstep s JOIN matrix_toolchain t ON t.id = s.toolchain_id "
        "JOIN matrix_validationjob j ON j.id = s.job_id "
        "WHERE s.bisection_id = ? ORDER BY s.number",
        (bisection,),
    )
    # Nothing was stored before: the ends first, then the release between,
    # each run by the runner worker.
    assert [(v, status, bool(reused), job) for v, status, reused, job in steps] == [
        ("0.1.13", "compile_error", False, "done"),
        ("0.1.15", "pass", False, "done"),
        ("0.1.14", "compile_error", False, "done"),
    ]


# The served cell, the on-call reviewer's two subscriptions, and a
# submitted softmax (reviewed elsewhere) current on the CPU backend; its
# first run on TileLang 0.1.13.
SERVED = """
import hashlib, json
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from matrix.fleet import services
from matrix.models import DeviceType, KernelRevision, Operator, Shape, Toolchain
from matrix.models.notifications import Subscription
from matrix.revisions import make_current
from matrix.services import shape_import
shape_import(rows=[("softmax", {{"M": 16, "N": 128}}, "float32", 1.0)],
             source_profile="e2e-served", served=True)
shape = Shape.objects.get(source_profile="e2e-served")
oncall = get_user_model().objects.create_user("oncall", email="oncall@example.com")
oncall.groups.add(Group.objects.get(name="reviewer"))
Subscription.objects.create(user=oncall, channel="email",
                            email="oncall@example.com", topics=["alert"])
hook = Subscription.objects.create(user=oncall, channel="webhook",
                                   url={hook!r}, topics=["alert"])
source = {source!r}
finite = KernelRevision.objects.create(
    operator=Operator.objects.get(name="softmax"), source=source,
    source_sha256=hashlib.sha256(source.encode()).hexdigest(),
    origin="submitted", review_state="approved", backends=["c"])
make_current(finite, ["c"])
old = Toolchain.objects.get(runners__name={runner!r}, tilelang_version="0.1.13")
cpu = DeviceType.objects.get(backend="c")
sweep = services.sweep_plan(cells=[(shape, cpu, old)])
print(json.dumps({{"shape": shape.pk, "old": old.pk, "secret": hook.secret,
                  "finite": finite.pk, "sweep": sweep.pk}}))
"""

# Make ``revision`` current on the CPU backend (a reviewer's decision) and
# run the served cell on 0.1.13 again.
RERUN = """
from matrix.fleet import services
from matrix.models import DeviceType, KernelRevision, Shape, Toolchain
from matrix.revisions import make_current
make_current(KernelRevision.objects.get(operator__name="softmax", {revision}), ["c"])
sweep = services.sweep_plan(cells=[(Shape.objects.get(pk={shape}),
    DeviceType.objects.get(backend="c"), Toolchain.objects.get(pk={old}))])
print(sweep.pk)
"""

# What Bisect on the alert's page does (matrix/views/alerts.py).
BISECT = """
from matrix.alerts.services import alert_bisect
from matrix.models.alerts import Alert
print(alert_bisect(alert=Alert.objects.get(pk={alert}), by=None).pk)
"""


def last_line(done) -> str:
    return done.stdout.strip().splitlines()[-1]


def test_a_revision_breaking_a_served_cell_alerts_once_is_bisected_and_fixed(
    cluster, runner, mail, hooks
):
    inbox, _ = mail
    seeded = json.loads(
        last_line(
            cluster.manage(
                "shell",
                "-c",
                SERVED.format(
                    hook=hooks.address,
                    source=FINITE_SOFTMAX.read_text(),
                    runner=runner,
                ),
            )
        )
    )
    shape, old = seeded["shape"], seeded["old"]

    def cell() -> str:
        rows = cluster.sql(
            "SELECT status FROM matrix_cell WHERE shape_id = ? AND toolchain_id = ?",
            (shape, old),
        )
        return rows[0][0] if rows else ""

    def rerun(revision: str) -> None:
        sweep = int(
            last_line(
                cluster.manage(
                    "shell",
                    "-c",
                    RERUN.format(revision=revision, shape=shape, old=old),
                )
            )
        )
        cluster.wait_finished(sweep)

    cluster.wait_finished(seeded["sweep"])
    assert cell() == "pass"

    # The library's softmax becomes current: on 0.1.13 it has no lowering
    # for tl.infinity. The cell's verdict is the failure (the pass before
    # was another revision's: nothing for a rerun to confirm).
    rerun('origin="library"')
    assert cell() == "compile_error"
    ((alert, kind, status, cells),) = cluster.sql(
        "SELECT id, kind, status, cell_count FROM matrix_alert"
    )
    assert (kind, status, cells) == ("revision", "compile_error", 1)
    opened = time.monotonic()
    # The receivers hear a message before the delivery task records it as
    # sent: wait for both records to leave `pending` too.
    cluster.wait(
        lambda: (
            inbox.messages
            and hooks.requests
            and not cluster.sql("SELECT 1 FROM matrix_delivery WHERE state = 'pending'")
        ),
        timeout=60,
        what="the alert's email and webhook, each recorded",
    )
    told_within = time.monotonic() - opened
    (email,) = inbox.messages
    assert email["to"] == ["oncall@example.com"]
    assert f"alert #{alert}" in email["body"]
    (request,) = hooks.requests
    assert signature_valid(
        seeded["secret"],
        request["headers"]["X-TileMatrix-Timestamp"],
        request["body"],
        request["headers"]["X-TileMatrix-Signature"],
    )
    assert f"alert #{alert}" in request["json"]["text"]
    assert request["json"]["link"].startswith(cluster.server + f"/alerts/{alert}/")
    # Sent by the control worker's delivery task, each attempt logged.
    assert sorted(cluster.sql("SELECT state, attempts FROM matrix_delivery")) == [
        ("sent", 1),
        ("sent", 1),
    ], f"told within {told_within:.1f} s"

    # Bisect from the alert: the new revision between 0.1.13 (where it
    # fails) and the newest release the runner hosts, 0.1.15. The runner
    # worker runs the releases it must, and the conclusion is written onto
    # the alert.
    bisection = int(
        last_line(cluster.manage("shell", "-c", BISECT.format(alert=alert)))
    )
    cluster.wait(
        lambda: (
            cluster.sql(
                "SELECT state FROM matrix_bisection WHERE id = ?", (bisection,)
            )[0][0]
            != "running"
        ),
        timeout=300,
        what=f"bisection {bisection} to end",
    )
    ((said,),) = cluster.sql(
        "SELECT bisection FROM matrix_alert WHERE id = ?", (alert,)
    )
    # PostgreSQL hands back the decoded object, SQLite its text.
    said = said if isinstance(said, dict) else json.loads(said)
    assert (said["id"], said["state"], said["release_version"]) == (
        bisection,
        "found",
        "0.1.15",
    ), said
    assert said["summary"].startswith("First good release: TileLang 0.1.15 ")
    steps = cluster.sql(
        "SELECT t.tilelang_version, s.status, s.reused FROM matrix_bisectionstep s "
        "JOIN matrix_toolchain t ON t.id = s.toolchain_id "
        "WHERE s.bisection_id = ? ORDER BY s.number",
        (bisection,),
    )
    assert [(v, status, bool(reused)) for v, status, reused in steps] == [
        ("0.1.13", "compile_error", True),
        ("0.1.15", "pass", False),
        ("0.1.14", "compile_error", False),
    ]
    # The bisection's own results opened nothing and told no one more.
    assert cluster.sql("SELECT COUNT(*) FROM matrix_alert") == [(1,)]

    # A reviewer reverts to the submitted softmax: the cell passes on
    # 0.1.13 again and the alert is fixed, by the system.
    rerun(f"pk={seeded['finite']}")
    assert cell() == "pass"
    assert cluster.sql(
        "SELECT state, open_cells FROM matrix_alert WHERE id = ?", (alert,)
    ) == [("fixed", 0)]
    # The fix tells no one. (A busy host may time the fixing run slower
    # than the pass before the break: that slowdown is an alert of its own.)
    about = f"alert #{alert}"
    assert [m for m in inbox.messages if about in m["body"]] == [email]
    assert [r for r in hooks.requests if about in r["json"]["text"]] == [request]
