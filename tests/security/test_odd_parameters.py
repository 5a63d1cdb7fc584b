"""Control characters and huge integers in any parameter of any page or API
read: a refusal in words (400 on the pages, 422 on the API), never a
server error. NUL cannot be stored in PostgreSQL's text, and an id past
64 bits cannot be compared with SQLite's integers: both once answered 500
(the PostgreSQL pass of the suite runs this file against the real one)."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from matrix.accounts.roles import ADMIN
from tests.security.helpers import NO_ROLE

HUGE = "9" * 25
CONTROLS = ["a\x00b", "x\x1b[31my", "tab\there", "\x7f", "line\nbreak"]
# On every page and parameter: the NUL PostgreSQL refuses, and an escape.
EVERYWHERE = CONTROLS[:2]
FILTERS = ["toolchain", "operator", "backend", "dtype", "served", "model", "q"]
# Every page a viewer reads, with the parameters it takes.
PAGES = [
    ("matrix", None, [*FILTERS, "open", "rows", "device"]),
    ("matrix-csv", None, FILTERS),
    ("models", None, ["toolchain", "model", "pieces", "q"]),
    ("models-csv", None, ["toolchain", "model"]),
    ("gaps", None, [*FILTERS, "status", "page", "build"]),
    ("gaps-csv", None, [*FILTERS, "status"]),
    ("errors", None, ["toolchain", "unsupported_after", "q"]),
    ("runners", None, ["q"]),
    ("upgrades", None, ["page"]),
    ("upgrade", "upgrade", ["evaluated", "page", "change", "operator"]),
    ("submissions", None, ["page"]),
    ("submission", "submission", []),
    ("sweep", "sweep", []),
    ("operator", "operator", ["toolchain", "dtype"]),
    ("operator-revisions", "operator", []),
]
PATHS_WITH_IDS = [
    f"/sweeps/{HUGE}/",
    f"/cells/{HUGE}/1/",
    f"/cells/1/{HUGE}/",
    f"/upgrades/{HUGE}/",
    f"/submissions/{HUGE}/",
]
API_READS = [
    (
        "/api/v1/matrix",
        ["toolchain", "operator", "backend", "dtype", "offset", "limit"],
    ),
    ("/api/v1/gaps", ["toolchain", "operator", "backend", "dtype", "offset", "limit"]),
    ("/api/v1/models", ["toolchain", "model"]),
    ("/api/v1/manifest", ["toolchain"]),
]


@pytest.fixture
def admin(people):
    browser = Client(raise_request_exception=False)
    browser.force_login(people[ADMIN])
    return browser


def _url(objects, name, argument) -> str:
    if argument is None:
        return reverse(name)
    if argument == "operator":
        return reverse(name, args=["softmax"])
    if argument == "upgrade":
        return reverse(name, args=[objects["upgrade"]])
    return reverse(name, args=[objects[argument]])


@pytest.mark.parametrize(("name", "argument", "params"), PAGES)
def test_a_control_character_in_any_page_parameter_is_a_400_in_words(
    admin, objects, name, argument, params
):
    url = _url(objects, name, argument)
    assert admin.get(url).status_code == 200
    for param in [*params, "anything"]:
        for value in CONTROLS if param == "anything" else EVERYWHERE:
            response = admin.get(url, {param: value})
            assert response.status_code == 400, (url, param, value)
            assert b"control character" in response.content


@pytest.mark.parametrize(("name", "argument", "params"), PAGES)
def test_a_huge_integer_in_any_page_parameter_is_no_server_error(
    admin, objects, name, argument, params
):
    url = _url(objects, name, argument)
    for param in params:
        for value in (HUGE, f"-{HUGE}"):
            response = admin.get(url, {param: value})
            assert response.status_code < 500, (url, param, value)


def test_a_huge_id_in_a_path_is_not_found(admin, objects):
    for path in PATHS_WITH_IDS:
        assert admin.get(path).status_code == 404, path


def test_a_control_character_in_a_form_post_is_a_400_and_changes_nothing(
    admin, objects
):
    from matrix.models.gate import Policy

    before = Policy.objects.count()
    response = admin.post(
        reverse("upgrade-policy"),
        {"perf_budget": "0.1", "speed_budget": "0.1", "required_approvals": "1",
         "note": "fine\x00then"},
    )  # fmt: skip
    assert response.status_code == 400
    assert b"control character" in response.content
    assert Policy.objects.count() == before
    # Line breaks and tabs in a text area are text, not control characters.
    response = admin.post(reverse("submission-new"), {"source": "a\r\n\tb"})
    assert b"control character" not in response.content


@pytest.mark.parametrize(("path", "params"), API_READS)
def test_the_api_refuses_control_characters_and_huge_integers_as_input(
    admin, objects, path, params
):
    for param in params:
        for value in [*CONTROLS, HUGE]:
            response = admin.get(path, {param: value})
            assert response.status_code < 500, (path, param, value)
            if value in CONTROLS:
                assert response.status_code == 422, (path, param, value)
                assert "control character" in response.json()["detail"]


def test_an_api_offset_or_id_past_any_row_is_refused_or_not_found(admin, objects):
    response = admin.get("/api/v1/matrix", {"offset": "99999999999999999999999"})
    assert response.status_code == 422
    assert "offset" in response.json()["detail"]
    assert admin.get(f"/api/v1/kernels/{HUGE}").status_code == 404
    revert = {"backends": ["c"], "comment": "back"}
    response = admin.post(
        f"/api/v1/kernels/{HUGE}/revert", revert, content_type="application/json"
    )
    assert response.status_code == 404
    # A revision id past any row in the page's revert form is refused in words.
    response = admin.post(
        reverse("operator-revert", args=["softmax"]),
        {"revision": HUGE, "backends": ["c"], "comment": "back"},
    )
    assert response.status_code == 400


def test_the_kernel_api_follows_the_pages_role_rule(objects, people, settings):
    settings.TILEMATRIX_ANONYMOUS_READ = False  # as deployed
    browser = Client(raise_request_exception=False)
    browser.force_login(people[NO_ROLE])
    pk = objects["api:kernel_read"]
    # Hidden, as the permission matrix has it for every kernel route.
    response = browser.get(f"/api/v1/kernels/{pk}")
    assert response.status_code == 404
    assert response.json()["detail"] == "no such submission"
    # The page says the same.
    assert browser.get(reverse("submissions")).status_code == 403
