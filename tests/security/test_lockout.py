"""Lockout that hurts only the attacker (issue 20 item 6): failed logins
count per (client address, username), the client address behind a TLS
proxy is the one the trusted proxy forwarded, and nobody else's word for it
is taken."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group
from django.core.exceptions import ImproperlyConfigured
from django.test import Client
from django.urls import reverse

from matrix import config
from matrix.lockout import client_address

PROXY = "10.0.0.2"
ATTACKER = "203.0.113.5"
REAL_USER = "198.51.100.7"


@pytest.fixture
def admin1(django_user_model):
    user = django_user_model.objects.create_user("admin1", password="right-pass-123")
    user.groups.add(Group.objects.get(name="viewer"))
    return user


@pytest.fixture
def behind_proxy(settings):
    settings.TILEMATRIX_TRUSTED_PROXIES = config.parse_networks(
        "TILEMATRIX_TRUSTED_PROXIES", f"{PROXY}, 10.9.0.0/16"
    )


def login(address: str, password: str, *, forwarded_for: str | None = None, peer=None):
    """A fresh browser logging in as admin1 from ``address``: through the
    proxy when ``forwarded_for`` is given."""
    meta = {"REMOTE_ADDR": peer or address}
    if forwarded_for is not None:
        meta["HTTP_X_FORWARDED_FOR"] = forwarded_for
    browser = Client()
    response = browser.post(
        reverse("login"), {"username": "admin1", "password": password}, **meta
    )
    return response, browser


def test_five_failures_from_one_address_do_not_stop_the_real_user_elsewhere(
    admin1, behind_proxy
):
    statuses = [
        login(PROXY, "wrong", forwarded_for=ATTACKER)[0].status_code for _ in range(5)
    ]
    assert statuses == [200] * 4 + [429]  # the form again, then the lockout

    real, browser = login(PROXY, "right-pass-123", forwarded_for=REAL_USER)
    assert real.status_code == 302
    assert browser.session["_auth_user_id"] == str(admin1.pk)

    # The attacker's address is locked out, even with the right password.
    locked, browser = login(PROXY, "right-pass-123", forwarded_for=ATTACKER)
    assert locked.status_code == 429
    assert "_auth_user_id" not in browser.session


def test_the_lockout_page_says_when_to_try_again(admin1, behind_proxy):
    for _ in range(5):
        login(PROXY, "wrong", forwarded_for=ATTACKER)

    locked, _ = login(PROXY, "wrong", forwarded_for=ATTACKER)

    page = locked.content.decode()
    assert locked.status_code == 429
    assert "Try again after" in page and "(in 15 minutes)" in page
    assert "Signing in from another address is not affected" in page
    assert 14 * 60 < int(locked["Retry-After"]) <= 15 * 60


def test_without_trusted_proxies_a_forwarded_header_is_not_believed(admin1):
    """Off by default: a client cannot escape its count, or pin failures on
    another address, by writing X-Forwarded-For itself."""
    for i in range(5):
        login(ATTACKER, "wrong", forwarded_for=f"192.0.2.{i}")
    locked, _ = login(ATTACKER, "right-pass-123", forwarded_for=REAL_USER)
    assert locked.status_code == 429
    real, _ = login(REAL_USER, "right-pass-123")
    assert real.status_code == 302


@pytest.mark.parametrize(
    ("peer", "forwarded", "client"),
    [
        # Not from a trusted proxy: the header is anyone's word.
        (ATTACKER, REAL_USER, ATTACKER),
        # From the proxy: the address it appended, whatever the client wrote
        # to its left.
        (PROXY, f"{REAL_USER}, {ATTACKER}", ATTACKER),
        # Through two trusted proxies: both skipped.
        (PROXY, f"{ATTACKER}, 10.9.3.4", ATTACKER),
        # Only trusted proxies in the chain: the nearest one.
        (PROXY, "10.9.3.4", PROXY),
        # No header: the proxy itself.
        (PROXY, None, PROXY),
        # A proxy that wrote no address: nothing in it is believed.
        (PROXY, f"{REAL_USER}, unknown", PROXY),
        (PROXY, "2001:db8::7", "2001:db8::7"),
    ],
)
def test_the_client_address_is_what_the_trusted_proxies_saw(
    rf, behind_proxy, peer, forwarded, client
):
    meta = {"REMOTE_ADDR": peer}
    if forwarded is not None:
        meta["HTTP_X_FORWARDED_FOR"] = forwarded
    assert client_address(rf.get("/", **meta)) == client


def test_trusted_proxies_are_addresses_or_networks():
    parsed = config.parse_networks("TILEMATRIX_TRUSTED_PROXIES", "10.0.0.2,fd00::/8")
    assert [str(n) for n in parsed] == ["10.0.0.2/32", "fd00::/8"]
    assert config.parse_networks("TILEMATRIX_TRUSTED_PROXIES", None) == ()
    with pytest.raises(
        ImproperlyConfigured, match="TILEMATRIX_TRUSTED_PROXIES: .*'proxy'"
    ):
        config.parse_networks("TILEMATRIX_TRUSTED_PROXIES", "10.0.0.2,proxy")
