"""Registering a runner through the runners page: the token is shown once
with the command, the host registers with it, the page shows it pending with
its inventory and key fingerprint, and approved it is online."""

from __future__ import annotations

from datetime import timedelta

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from matrix.fleet import services
from matrix.fleet.models import RegistrationToken, token_digest
from runners import protocol, signing

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

INVENTORY = {
    "devices": [{"backend": "c", "vendor": "x86-64", "model": "CPU"}],
    "toolchains": [
        {
            "name": "tl-0.1.15",
            "interpreter": "/usr/bin/python3",
            "components": {"tilelang": "0.1.15"},
        }
    ],
}


def test_register_a_runner_and_see_it_online(tab, admin_user):
    page = tab.page
    tab.login("root", "root-pass-123")
    tab.open("/runners/")
    assert "No runner is registered yet" in page.inner_text("#runner-list")
    page.click("text=Register a runner")
    command = page.wait_for_selector("#register-cmd").inner_text()
    token = command.split("--token ", 1)[1].split()[0]
    assert command.startswith(
        ".venv/bin/python manage.py runner register --server http"
    )
    assert command.endswith('--key-dir "var/runners/$(hostname -s)"')
    work = page.inner_text("#work-cmd")
    assert (
        work
        == '.venv/bin/python manage.py runner work --key-dir "var/runners/$(hostname -s)"'
    )

    # What `manage.py runner register` and the worker's first heartbeat do.
    key = Ed25519PrivateKey.generate()
    runner = services.runner_register(
        token=token,
        name="cpu-ui",
        public_key=signing.public_key_hex(key),
        inventory=INVENTORY,
    )
    services.runner_heartbeat(
        envelope=protocol.heartbeat_envelope(
            runner_name="cpu-ui", sequence=1, state="online", key=key
        )
    )
    # The list refreshes itself every 10 s.
    page.wait_for_selector("#runner-list tr:has-text('cpu-ui')", timeout=15_000)
    row = page.locator("#runner-list tr", has_text="cpu-ui")
    # Pending, with what it claims shown for the admin to check.
    claims = row.inner_text()
    assert "pending approval" in claims and "no queue until approved" in claims
    assert runner.key_fingerprint in claims and "x86-64 CPU" in claims
    tab.screenshot("runners-pending")
    row.locator("button", has_text="Approve").click()
    page.wait_for_selector("#runner-list tr:has-text('cpu-ui') .badge.active")
    assert page.evaluate("document.activeElement.textContent") == "Maintenance"
    assert "online" in row.inner_text()
    tab.screenshot("runners")

    row.locator("text=Maintenance").click()
    page.wait_for_selector("#runner-list tr:has-text('cpu-ui') .badge.maintenance")
    assert tab.errors == []


def test_maintenance_changes_the_row_in_place(tab, admin_user, cpu_runner):
    """The row is swapped by the action's answer, not left empty until the
    list's next refresh, 10 s later."""
    page = tab.page
    tab.login("root", "root-pass-123")
    tab.open("/runners/")
    row = page.locator(f"#runner-{cpu_runner.pk}")
    row.locator("button", has_text="Maintenance").click()
    row.locator(".badge.maintenance").wait_for(timeout=3_000)
    assert "End maintenance" in row.inner_text()


def test_the_keyboard_stays_on_the_maintenance_button_it_pressed(
    tab, admin_user, cpu_runner
):
    page = tab.page
    tab.login("root", "root-pass-123")
    tab.open("/runners/")
    row = f"#runner-{cpu_runner.pk}"
    page.focus(f"{row} button:has-text('Maintenance')")
    page.keyboard.press("Enter")
    page.wait_for_selector(f"{row} .badge.maintenance", timeout=3_000)
    assert page.evaluate("document.activeElement.textContent") == "End maintenance"
    page.keyboard.press("Enter")
    page.wait_for_selector(f"{row} .badge.active", timeout=3_000)
    assert page.evaluate("document.activeElement.textContent") == "Maintenance"


def test_a_double_click_on_register_mints_exactly_one_token(tab, admin_user):
    page = tab.page
    tab.login("root", "root-pass-123")
    tab.open("/runners/")
    page.dblclick("text=Register a runner")
    command = page.wait_for_selector("#register-cmd").inner_text()
    # Long enough for a second request, had one been sent, to land.
    page.wait_for_timeout(500)
    # The one token minted is the one on the page: no hidden second one.
    token = command.split("--token ", 1)[1].split()[0]
    assert list(RegistrationToken.objects.values_list("digest", flat=True)) == [
        token_digest(token)
    ]


def test_the_keyboard_lands_on_the_revoked_state_after_revoking(
    tab, admin_user, cpu_runner
):
    page = tab.page
    tab.login("root", "root-pass-123")
    tab.open("/runners/")
    row = f"#runner-{cpu_runner.pk}"
    page.once("dialog", lambda dialog: dialog.accept())
    page.focus(f"{row} button:has-text('Revoke')")
    page.keyboard.press("Enter")
    page.wait_for_selector(f"{row} .badge.revoked", timeout=3_000)
    page.wait_for_function(
        f"() => document.activeElement.closest('{row}') !== null", timeout=3_000
    )
    assert page.evaluate("document.activeElement.textContent").startswith("revoked ")


def test_a_refused_claim_leaves_no_column_behind(tab, admin_user):
    """A host claiming a device no one has yet is refused from the page:
    the claim was shown, never recorded, and the refusal is audited."""
    from matrix.models import AuditEvent, DeviceType

    inventory = {
        **INVENTORY,
        "devices": [{"backend": "npu", "vendor": "Huawei", "model": "Ascend 910B"}],
    }
    services.runner_register(
        token=services.token_create(expires=timedelta(hours=1)),
        name="npu-claim",
        public_key=signing.public_key_hex(Ed25519PrivateKey.generate()),
        inventory=inventory,
    )
    tab.login("root", "root-pass-123")
    tab.open("/runners/")
    row = tab.page.locator("#runner-list tr", has_text="npu-claim")
    assert "Huawei Ascend 910B · npu" in row.inner_text()
    assert not DeviceType.objects.filter(model="Ascend 910B").exists()
    tab.page.once("dialog", lambda dialog: dialog.accept())
    row.locator("button", has_text="Refuse").click()
    tab.page.wait_for_selector("#runner-list tr:has-text('npu-claim') .badge.revoked")
    assert "refused" in row.inner_text()
    assert AuditEvent.objects.filter(verb="runner.refuse").count() == 1
    assert not DeviceType.objects.filter(model="Ascend 910B").exists()
    tab.open("/")
    assert "Ascend" not in tab.page.inner_text("main")
    assert tab.errors == []
