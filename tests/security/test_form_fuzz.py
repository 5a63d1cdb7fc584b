"""Hypothesis against every form of the app, as a user allowed to post it:
whatever the fields hold, the answer is never a server error.

Each form is posted end to end through its view (CSRF checks on, the token
sent as htmx sends it), so the view's own parsing is fuzzed with the form's.
"""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from matrix.accounts.roles import ADMIN, KERNEL_AUTHOR, REVIEWER, RUNNER_ADMIN
from matrix.gate.forms import DecisionForm, ExceptionForm, PolicyForm, ProposalForm
from matrix.views.submissions import ReviewForm, SubmissionForm
from tests.security.helpers import SUPERUSER

EXAMPLES = 40
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# Values a hostile or careless client sends: text of any kind, numbers as
# text, valid choices, lists of values and nothing at all.
VALUE = st.one_of(
    st.text(max_size=200),
    st.integers(min_value=-(2**63), max_value=2**64).map(str),
    st.sampled_from(
        [
            "",
            "0",
            "-1",
            "approve",
            "reject",
            "maintenance",
            "active",
            "c",
            "softmax",
            "elementwise_add",
            "float32",
            "tilelang-0.1.99",
            "x" * 5000,
            "\x00",
            "{}",
            "[]",
        ]
    ),
)
VALUES = st.one_of(VALUE, st.lists(VALUE, max_size=3))


def fields_of(form_class) -> list[str]:
    return list(form_class.base_fields)


# (URL name, URL argument from the objects fixture, who may post, fields).
FORMS = [
    ("submission-new", None, KERNEL_AUTHOR, fields_of(SubmissionForm)),
    ("submission-review", "submission", REVIEWER, fields_of(ReviewForm)),
    ("upgrade-new", None, ADMIN, fields_of(ProposalForm)),
    ("upgrade-decide", "upgrade", REVIEWER, fields_of(DecisionForm)),
    ("upgrade-exception", "upgrade", REVIEWER, fields_of(ExceptionForm)),
    ("upgrade-policy", None, SUPERUSER, fields_of(PolicyForm)),
    ("runner-health", "runner-health", RUNNER_ADMIN, ["health"]),
    (
        "gaps-run",
        None,
        RUNNER_ADMIN,
        ["toolchain", "operator", "backend", "dtype", "status", "build"],
    ),
    ("login", None, None, ["username", "password"]),
]
# Filter forms read from the query string.
QUERIES = [
    ("matrix", ["toolchain", "operator", "backend", "dtype", "served", "open"]),
    ("gaps", ["toolchain", "operator", "backend", "dtype", "status", "page", "build"]),
    ("gaps-csv", ["toolchain", "backend", "dtype", "status"]),
    ("errors", ["toolchain"]),
    ("submissions", ["page"]),
]


def body(fields: list[str]):
    """Some of the form's fields (each maybe missing) and maybe one extra."""
    known = st.fixed_dictionaries({}, optional={f: VALUES for f in fields})
    extra = st.dictionaries(st.text(min_size=1, max_size=20), VALUES, max_size=1)
    return st.tuples(known, extra).map(lambda pair: {**pair[1], **pair[0]})


@pytest.fixture
def browser_for(people):
    """A CSRF-checking client signed in as a persona, with its token."""

    def make(persona):
        browser = Client(enforce_csrf_checks=True)
        if persona is not None:
            browser.force_login(people[persona])
        browser.get(reverse("login"))
        return browser, browser.cookies["csrftoken"].value

    return make


@pytest.mark.parametrize(("name", "argument", "persona", "fields"), FORMS)
def test_no_form_post_is_a_server_error(
    name, argument, persona, fields, objects, browser_for
):
    url = reverse(name, args=[objects[argument]] if argument else [])
    browser, token = browser_for(persona)
    seen = []

    @FUZZ
    @given(data=body(fields))
    def post(data):
        response = browser.post(url, data, headers={"X-CSRFToken": token})
        seen.append(response.status_code)
        assert response.status_code < 500, (data, response.status_code)

    post()
    assert len(seen) == EXAMPLES
    # Some examples got through the permission check to the form itself.
    assert any(code not in (403, 404) for code in seen)


@pytest.mark.parametrize(("name", "fields"), QUERIES)
def test_no_filter_query_is_a_server_error(name, fields, objects, browser_for):
    browser, _ = browser_for(ADMIN)
    seen = []

    @FUZZ
    @given(params=body(fields))
    def get(params):
        response = browser.get(reverse(name), params)
        seen.append(response.status_code)
        assert response.status_code < 500, (params, response.status_code)

    get()
    assert len(seen) == EXAMPLES
