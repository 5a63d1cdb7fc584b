"""Every page in headless Chromium under the Content-Security-Policy: the
policy is sent, and the browser reports no violation (an inline script,
style or handler would be refused and logged as a console error)."""

from __future__ import annotations

from django.urls import reverse

from matrix.models import Operator
from matrix.security import CONTENT_SECURITY_POLICY
from matrix.submissions import kernel_submit
from tests.security.helpers import attack_source


def test_no_page_breaks_the_content_security_policy(
    tab, results, cpu_runner, device_types, admin_user
):
    top = results["top"]
    operator = Operator.objects.get(pk=top.operator_id)
    submission = kernel_submit(
        operator=operator,
        source=attack_source("good_add").replace("good_add", "csp_add"),
        author=admin_user,
        backends=["c"],
    )
    tab.login("root", "root-pass-123")
    paths = [
        "/",
        f"/?open={operator.name}",
        reverse("gaps"),
        reverse("errors"),
        reverse("runners"),
        reverse("cell", args=[top.pk, device_types["c"].pk]),
        reverse("upgrades"),
        reverse("submissions"),
        reverse("submission-new"),
        reverse("submission", args=[submission.pk]),
        reverse("operator-revisions", args=[operator.name]),
        reverse("admin:index"),
    ]
    for path in paths:
        response = tab.page.goto(tab.base_url + path, wait_until="load")
        assert response is not None and response.ok, path
        assert response.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    # The tab fixture fails the test on any console error, CSP reports included.
