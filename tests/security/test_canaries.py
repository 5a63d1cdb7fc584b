"""Canary secrets planted in the environment, in the settings and in a
runner key never show up in logs, stored results, error messages or pages,
after a submitted kernel's compile error that tries to echo all of them."""

from __future__ import annotations

import json
import logging
import tempfile
from pathlib import Path

import pytest
from django.urls import reverse

from matrix.models import Result, Shape, Status
from runners.harness.sandbox import run_job
from tests.security.helpers import (
    CANARIES,
    ENV_CANARY,
    KEY_CANARY,
    SETTINGS_CANARY,
    attack_job,
)
from tests.ui.conftest import record


@pytest.fixture(scope="module")
def echoed():
    """The result of a kernel that echoes every secret it can reach, run by
    a supervisor holding all three canaries."""
    secrets_dir = Path(tempfile.mkdtemp(prefix="tm-canary-"))
    secrets_dir.chmod(0o755)
    key = secrets_dir / "runner.key"
    key.write_text(KEY_CANARY)
    secret_key = secrets_dir / "secret_key"
    secret_key.write_text(SETTINGS_CANARY)
    for path in (key, secret_key):
        path.chmod(0o600)
    job = attack_job(
        "echo_secrets",
        fill={"@KEY_PATH@": str(key), "@SECRET_KEY_PATH@": str(secret_key)},
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DJANGO_SECRET_KEY", SETTINGS_CANARY)
        patch.setenv("TM_CANARY_SECRET", ENV_CANARY)
        patch.setenv("DATABASE_URL", f"postgres://tm:{ENV_CANARY}@db/tm")
        result = run_job(job, cache_dir="unused")
    yield result
    for path in (key, secret_key):
        path.unlink()
    secrets_dir.rmdir()


def _assert_clean(text: str, where: str) -> None:
    for canary in CANARIES:
        assert canary not in text, f"{canary} leaked into {where}"


def test_the_compile_error_echoes_nothing_secret(echoed):
    assert echoed["status"] == "compile_error"
    message = echoed["error"]["message"]
    assert "echo:" in message  # the kernel did run and did try
    # The key files are not even there: the sandbox binds nothing of theirs.
    assert "No such file or directory" in message
    _assert_clean(json.dumps(echoed), "the result")


def test_stored_results_pages_and_logs_stay_clean(
    echoed, client, owner, toolchains, device_types, settings, caplog, capsys
):
    settings.SECRET_KEY = SETTINGS_CANARY
    caplog.set_level(logging.DEBUG)
    shape = Shape.objects.select_related("operator").first()
    result = record(
        shape,
        device_types["c"],
        toolchains[1],
        Status.COMPILE_ERROR,
        error_message=echoed["error"]["message"],
        error_signature=echoed["error"]["signature"],
    )
    stored = Result.objects.get(pk=result.pk)
    _assert_clean(stored.error_message, "the stored result")
    client.force_login(owner)
    pages = [
        client.get(reverse("errors")),
        client.get(
            reverse("cell", args=[shape.pk, device_types["c"].pk]),
            {"toolchain": toolchains[1].name},
        ),
    ]
    for response in pages:
        assert response.status_code == 200
        assert echoed["error"]["signature"] in response.content.decode()
        _assert_clean(response.content.decode(), response.request["PATH_INFO"])
    captured = capsys.readouterr()
    _assert_clean(caplog.text + captured.out + captured.err, "the logs")


def test_a_registration_token_is_never_logged(db, client, caplog, capsys):
    caplog.set_level(logging.DEBUG)
    token = "tm-token-canary-0e1f2a3b4c"
    response = client.post(
        "/api/v1/runners/register",
        {"token": token, "name": "h", "public_key": "00" * 32, "inventory": {}},
        content_type="application/json",
    )
    assert 400 <= response.status_code < 500
    captured = capsys.readouterr()
    assert token not in caplog.text + captured.out + captured.err
    assert token not in response.content.decode()
