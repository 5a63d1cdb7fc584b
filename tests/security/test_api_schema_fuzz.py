"""Schemathesis against /api/v1/openapi.json, in process through the WSGI
application: every operation, with generated and mutated bodies, paths and
query strings, answers without a server error and as its schema declares. Requests carry the session
and CSRF token of a user who is both kernel author and reviewer, so the
session-authenticated routes are fuzzed past their authentication too."""

from __future__ import annotations

import pytest
import schemathesis
from django.contrib.auth.models import Group
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from django.test import Client
from django.urls import reverse
from hypothesis import HealthCheck, settings
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from matrix.accounts.roles import KERNEL_AUTHOR, REVIEWER, VIEWER
from matrix.wsgi import application

EXAMPLES = 60
schema = schemathesis.openapi.from_wsgi("/api/v1/openapi.json", application)


@pytest.fixture
def session(catalog, django_user_model):
    user = django_user_model.objects.create_user("fuzzer", password="x")
    for role in (VIEWER, KERNEL_AUTHOR, REVIEWER):
        user.groups.add(Group.objects.get(name=role))
    browser = Client()
    browser.force_login(user)
    browser.get(reverse("login"))
    cookies = {name: morsel.value for name, morsel in browser.cookies.items()}
    # The WSGI handler closes the database connection around each request, as
    # it should in production; inside the test's transaction that would close
    # it under the test (PostgreSQL then fails every later request). Django's
    # test client unhooks the same signal around its own requests and hooks it
    # back after each, so this comes after the client is done.
    for signal in (request_started, request_finished):
        signal.disconnect(close_old_connections)
    yield cookies, cookies["csrftoken"]
    for signal in (request_started, request_finished):
        signal.connect(close_old_connections)


@schema.parametrize()
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
)
def test_every_api_answer_is_one_its_schema_declares(case, session):
    """No server error, and every answer (refusals included) has a status,
    content type and body the schema declares for that operation: a client
    generated from the schema knows every answer it can get."""
    cookies, token = session
    case.call_and_validate(
        cookies=cookies,
        headers={"X-CSRFToken": token},
        checks=[
            not_a_server_error,
            status_code_conformance,
            content_type_conformance,
            response_schema_conformance,
        ],
    )
