"""A flood: 500 served cells turned red by one kernel revision give one
alert, one email to a real SMTP server and one signed webhook to a real
HTTP receiver, whatever the number of cells."""

from __future__ import annotations

import json

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from matrix.models import AuditEvent, Status
from matrix.models.alerts import Alert, AlertCell, AlertState, CauseKind
from matrix.models.notifications import Subscription
from matrix.notifications.channels import signature_valid

from .conftest import COMPILE_ERROR, claimed, ingest, new_revision

pytestmark = pytest.mark.django_db


def test_500_cells_broken_by_one_revision_make_one_alert_and_one_message_each(
    cpu_runner, green, reviewer, smtp, hooks, deliveries_run
):
    mail = Subscription.objects.create(
        user=reviewer, channel="email", email="oncall@example.com", topics=["alert"]
    )
    hook = Subscription.objects.create(
        user=reviewer, channel="webhook", url=hooks.address, topics=["alert"]
    )
    shapes = green(500)
    revision = new_revision()
    jobs = claimed(cpu_runner, shapes)

    with CaptureQueriesContext(connection) as queries:
        deliveries_run(
            ingest, cpu_runner, jobs, status="compile_error", **COMPILE_ERROR
        )

    (alert,) = Alert.objects.all()
    assert (alert.kind, alert.status, alert.signature) == (
        CauseKind.REVISION,
        Status.COMPILE_ERROR,
        "sig-release",
    )
    assert alert.revision == revision
    assert (alert.cell_count, alert.open_cells) == (500, 500)
    assert alert.served_weight == pytest.approx(500.0)
    assert alert.state == AlertState.NEW
    assert AlertCell.objects.filter(alert=alert).count() == 500
    assert AuditEvent.objects.filter(verb="alert.open").count() == 1
    # Set-based: besides inserting the cells (in as few statements as the
    # database takes rows at once), the statements on the alerts' tables do
    # not grow with the cells.
    on_alerts = [
        q["sql"][:60]
        for q in queries.captured_queries
        if "matrix_alert" in q["sql"] and 'INTO "matrix_alertcell"' not in q["sql"]
    ]
    assert len(on_alerts) <= 10, on_alerts

    (email,) = smtp.messages
    assert email["to"] == ["oncall@example.com"]
    assert f"alert #{alert.pk}" in email["body"]
    assert "500 cells" in email["body"]
    (request,) = hooks.requests
    headers = request["headers"]
    assert signature_valid(
        hook.secret,
        headers["X-TileMatrix-Timestamp"],
        request["body"],
        headers["X-TileMatrix-Signature"],
    )
    body = json.loads(request["body"])
    assert f"alert #{alert.pk}" in body["text"]
    assert body["data"]["cells"] == 500
    assert mail.deliveries.get().state == "sent"
