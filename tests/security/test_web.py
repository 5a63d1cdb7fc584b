"""The web layer's defences: CSRF on every state-changing view, cookie
flags, security headers, login throttling, sensitive parameters, and a
clean `check --deploy`."""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
from pathlib import Path

from django.test import Client
from django.urls import reverse

from tests import forkserver
from tests.security.test_permission_matrix import fill, url_patterns

REPO = Path(__file__).resolve().parents[2]
PRODUCTION_ENV = {
    "DJANGO_DEBUG": "0",
    "DJANGO_SECRET_KEY": secrets.token_urlsafe(50),
    "DJANGO_ALLOWED_HOSTS": "tilematrix.example.org",
}


def _manage(*args: str, code: str | None = None) -> subprocess.CompletedProcess:
    # The browser tests' opt-out of async safety is theirs, not a deployment's.
    env = {
        **{k: v for k, v in os.environ.items() if k != "DJANGO_ALLOW_ASYNC_UNSAFE"},
        **PRODUCTION_ENV,
    }
    command = ["manage.py", *args] if code is None else ["-c", code]
    return forkserver.run(command, cwd=REPO, env=env, timeout=120)


def test_check_deploy_is_clean():
    done = _manage("check", "--deploy", "--fail-level", "WARNING")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "System check identified no issues (0 silenced)." in done.stdout


def test_production_cookies_are_secure_and_session_cookies_http_only():
    code = (
        "import django, os; os.environ['DJANGO_SETTINGS_MODULE']='matrix.settings';"
        "django.setup(); from django.conf import settings as s;"
        "print(s.SESSION_COOKIE_SECURE, s.CSRF_COOKIE_SECURE, "
        "s.SESSION_COOKIE_HTTPONLY, s.SECURE_HSTS_SECONDS > 0, "
        "s.TILEMATRIX_ANONYMOUS_READ)"
    )
    done = _manage(code=code)
    assert done.stdout.split() == ["True", "True", "True", "True", "False"], done.stderr


def test_every_state_changing_view_refuses_a_post_without_csrf(objects, people):
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(people["superuser"])
    checked = []
    for route, name in url_patterns():
        # The API authenticates runners by signature, not by cookie; its
        # session-authenticated routes are checked in test_submissions.
        if name.startswith("api:"):
            continue
        url = fill(route, name, objects)
        response = browser.post(url, {})
        if response.status_code == 405:
            continue  # not a state-changing view
        checked.append(name)
        assert response.status_code == 403, f"{name} accepted a POST without CSRF"
        assert b"CSRF" in response.content
    assert {"gaps-run", "runner-token", "submission-new", "upgrade-decide"} <= set(
        checked
    )


def test_htmx_sends_the_csrf_token_from_the_body(client, owner):
    client.force_login(owner)
    page = client.get(reverse("matrix")).content.decode()
    assert re.search(r"<body hx-headers='\{\"X-CSRFToken\": \"\w{32,}\"\}'>", page)
    config = json.loads(
        re.search(r"<meta name=\"htmx-config\" content='([^']*)'>", page).group(1)
    )
    # No injected indicator style (the CSP has no 'unsafe-inline'), and Back
    # reloads from the server instead of a snapshot htmx would keep in
    # localStorage (which also drops what the controls were set to).
    assert config["includeIndicatorStyles"] is False
    assert config["historyCacheSize"] == 0


def test_pages_carry_the_security_headers(client, owner):
    client.force_login(owner)
    response = client.get(reverse("matrix"))
    csp = response["Content-Security-Policy"]
    assert "default-src 'self'" in csp and "script-src 'self'" in csp
    assert "unsafe-inline" not in csp and "frame-ancestors 'none'" in csp
    assert response["X-Frame-Options"] == "DENY"
    assert response["X-Content-Type-Options"] == "nosniff"
    assert response["Referrer-Policy"] == "same-origin"


def test_the_session_cookie_is_http_only(client, owner):
    response = client.post(
        reverse("login"), {"username": "owner", "password": "owner-pass-123"}
    )
    assert response.status_code == 302
    assert response.cookies["sessionid"]["httponly"] is True


def test_login_is_throttled_after_five_failures(client, owner):
    for _ in range(5):
        client.post(reverse("login"), {"username": "owner", "password": "wrong"})
    locked = client.post(
        reverse("login"), {"username": "owner", "password": "owner-pass-123"}
    )
    assert locked.status_code == 429
    assert "_auth_user_id" not in client.session


def test_login_and_token_views_hide_their_post_parameters(client, owner, people):
    response = client.post(
        reverse("login"), {"username": "owner", "password": "owner-pass-123"}
    )
    assert response.wsgi_request.sensitive_post_parameters == "__ALL__"
    client.force_login(people["runner admin"])
    response = client.post(reverse("runner-token"))
    assert response.status_code == 200
    assert response.wsgi_request.sensitive_post_parameters == "__ALL__"


def test_the_admin_site_is_for_the_admin_role_only(client, people):
    for persona in ("viewer", "reviewer", "runner admin"):
        client.force_login(people[persona])
        response = client.get(reverse("admin:index"))
        assert response.status_code == 302 and "/admin/login/" in response["Location"]
    staff = people["viewer"]
    staff.is_staff = True
    staff.save()
    client.force_login(staff)
    assert client.get(reverse("admin:index")).status_code == 302
    client.force_login(people["admin"])
    assert client.get(reverse("admin:index")).status_code == 200
