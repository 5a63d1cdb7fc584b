"""Every URL of the URLconf, with GET and POST, as every role: the answer is
the one the role table below expects. The URL list comes from walking the
resolver, so a new view fails this test until it is classified here.

Run with anonymous reading off, as a deployment runs."""

from __future__ import annotations

from django.urls import URLPattern, URLResolver, get_resolver

from matrix.accounts.roles import ADMIN, KERNEL_AUTHOR, REVIEWER, RUNNER_ADMIN, VIEWER
from tests.security.helpers import ANONYMOUS, NO_ROLE, PERSONAS, SUPERUSER

WITH_ROLE = frozenset(PERSONAS) - {ANONYMOUS, NO_ROLE}
EVERYONE = frozenset(PERSONAS)
METHODS = ("GET", "POST")
SWEEPERS = frozenset({REVIEWER, RUNNER_ADMIN, ADMIN, SUPERUSER})
RUNNER_ADMINS = frozenset({RUNNER_ADMIN, ADMIN, SUPERUSER})
AUTHORS = frozenset({KERNEL_AUTHOR, ADMIN, SUPERUSER})
SUBMISSION_REVIEWERS = frozenset({REVIEWER, ADMIN, SUPERUSER})
# The pending submission is the kernel author's: reviewers and its author
# see it, everyone else gets a 404.
SUBMISSION_READERS = frozenset({KERNEL_AUTHOR, REVIEWER, ADMIN, SUPERUSER})
NOBODY = frozenset()


def page(get=None, post=None, hidden_from=NOBODY):
    """Who gets an answer (not 403/404/login) per method; None: the method
    is not allowed (405 for anyone the role gate lets through)."""
    return {"GET": get, "POST": post, "hidden_from": hidden_from}


READ = page(get=WITH_ROLE)

# The role table: one row per URL name. Upgrade gate rules are the gate's:
# reviewers are the policy's reviewer group, the proposer (here the admin)
# may re-evaluate, only superusers edit the policy, and only a backend's
# owner signs off its exception (nobody here owns one).
EXPECTED = {
    "matrix": READ,
    "matrix-csv": READ,
    "models": READ,
    "models-csv": READ,
    "operator": READ,
    "operator-revisions": READ,
    "operator-revert": page(post=SUBMISSION_REVIEWERS),
    "gaps": READ,
    "gaps-run": page(post=SWEEPERS),
    "gaps-neighbours": page(post=SWEEPERS),
    "gaps-csv": READ,
    "sweep": READ,
    "cell": READ,
    "cell-job": READ,
    "errors": READ,
    "runners": READ,
    "runner-token": page(post=RUNNER_ADMINS),
    "runner-health": page(post=RUNNER_ADMINS),
    "runner-revoke": page(post=RUNNER_ADMINS),
    "runner-approve": page(post=RUNNER_ADMINS),
    "runner-refuse": page(post=RUNNER_ADMINS),
    "upgrades": READ,
    "upgrade-new": page(
        get={REVIEWER, ADMIN, SUPERUSER}, post={REVIEWER, ADMIN, SUPERUSER}
    ),
    "upgrade-policy": page(get={SUPERUSER}, post={SUPERUSER}),
    "upgrade": READ,
    "upgrade-decide": page(post={REVIEWER}),
    "upgrade-reevaluate": page(post={REVIEWER, ADMIN, SUPERUSER}),
    "upgrade-rollout": page(post={REVIEWER, SUPERUSER}),
    "upgrade-exception": page(post={REVIEWER}),
    "upgrade-exception-sign-off": page(post=NOBODY),
    "alerts": READ,
    "alert": READ,
    # Reviewers triage (the admin role holds every role); nobody here owns a
    # backend in the policy.
    "alert-triage": page(post={REVIEWER, ADMIN, SUPERUSER}),
    "alert-bisect": page(post=SWEEPERS),
    # Everyone with a role subscribes; a subscription (the viewer's here) is
    # its owner's and the admins' to test or stop.
    "notifications": page(get=WITH_ROLE, post=WITH_ROLE),
    "subscription-test": page(post={VIEWER, ADMIN, SUPERUSER}),
    "subscription-stop": page(post={VIEWER, ADMIN, SUPERUSER}),
    "upgrade-bisect": page(post=SWEEPERS),
    "bisection": READ,
    "submissions": READ,
    "submission-new": page(get=AUTHORS, post=AUTHORS),
    "submission": page(get=SUBMISSION_READERS, hidden_from={VIEWER, RUNNER_ADMIN}),
    "submission-review": page(
        post=SUBMISSION_REVIEWERS, hidden_from={VIEWER, RUNNER_ADMIN}
    ),
    "login": page(get=EVERYONE, post=EVERYONE),
    "logout": page(get=EVERYONE, post=EVERYONE),  # GET shows the button
    "favicon": page(get=EVERYONE, post=EVERYONE),
    # The API authenticates each route itself (signed runner messages,
    # registration tokens, sessions for kernel submissions).
    "api:openapi-json": page(get=EVERYONE, post=EVERYONE),
    "api:api-root": page(get=NOBODY, post=NOBODY, hidden_from=EVERYONE),
    "api:health": page(get=EVERYONE),
    "api:register": page(post=EVERYONE),
    "api:heartbeat": page(post=EVERYONE),
    "api:jobs_claim": page(post=EVERYONE),
    "api:runner_recover": page(post=EVERYONE),
    "api:outbox_pending": page(post=EVERYONE),
    "api:runner_queues": page(post=EVERYONE),
    "api:results_upload": page(post=EVERYONE),
    # No manifest is exported in this world: a 404 for everyone.
    "api:manifest": page(get=NOBODY, hidden_from=EVERYONE),
    # Coverage reads as the pages do.
    "api:coverage_matrix": page(get=WITH_ROLE),
    "api:coverage_gaps": page(get=WITH_ROLE),
    "api:coverage_models": page(get=WITH_ROLE),
    "api:alerts_list": page(get=WITH_ROLE),
    "api:kernel_create": page(post=AUTHORS),
    "api:kernel_read": page(
        get=SUBMISSION_READERS, hidden_from=WITH_ROLE - SUBMISSION_READERS | {NO_ROLE}
    ),
    "api:kernel_review": page(
        post=SUBMISSION_REVIEWERS,
        hidden_from=WITH_ROLE - SUBMISSION_READERS | {NO_ROLE},
    ),
    "api:kernel_revert": page(post=SUBMISSION_REVIEWERS),
    "api:bisection_read": page(get=WITH_ROLE),
}
# The admin site: anyone without the admin role is sent to its login page;
# the admin role gets the admin's own answers (read-only models refuse
# add/delete, and so on), never the login page.
ADMIN_SITE = "admin site"
ADMIN_HOLDERS = frozenset({ADMIN, SUPERUSER})
ADMIN_PUBLIC = {"admin:login", "admin:logout"}
# JSON bodies for API routes: valid enough to reach the permission check.
API_BODIES = {
    "api:kernel_create": {
        "operator": "softmax",
        "source": "import os",
        "backends": ["c"],
    },
    "api:kernel_review": {"decision": "maybe"},
    "api:kernel_revert": {"backends": ["c"], "comment": "back"},
}


def url_patterns(patterns=None, prefix="", namespace=()):
    """(route, qualified name, pattern) for every URL the app serves."""
    for entry in get_resolver().url_patterns if patterns is None else patterns:
        if isinstance(entry, URLResolver):
            inner = namespace + ((entry.namespace,) if entry.namespace else ())
            yield from url_patterns(
                entry.url_patterns, prefix + str(entry.pattern), inner
            )
        elif isinstance(entry, URLPattern):
            route = prefix + str(entry.pattern)
            # An unnamed pattern is classified by its route.
            yield route, ":".join(namespace + (entry.name or route,))


def expected(name: str) -> dict | None:
    if name.startswith("admin:"):
        return ADMIN_SITE
    return EXPECTED.get(name)


def test_every_url_is_classified():
    unknown = sorted({name for _, name in url_patterns() if expected(name) is None})
    assert unknown == [], f"classify these views in EXPECTED: {unknown}"


def fill(route: str, name: str, objects: dict) -> str:
    """The route with its converters replaced by real objects' ids."""
    import re

    def value(match):
        kind, arg = match.group(1) or "str", match.group(2)
        if arg in objects:
            return str(objects[arg])
        if arg == "pk":
            return str(objects.get(name, objects["upgrade"]))
        if name.startswith("admin:") and arg == "object_id":
            return str(_admin_object(name))
        if arg == "app_label":
            return "matrix"
        if arg == "content_type_id":
            from django.contrib.contenttypes.models import ContentType

            return str(ContentType.objects.first().pk)
        return "1" if kind in ("int", "path") else "x"

    route = re.sub(r"<(?:(\w+):)?(\w+)>", value, route)
    route = re.sub(r"\(\?P<(\w+)>[^)]*\)", lambda m: value(_fake(m.group(1))), route)
    return "/" + route.lstrip("^").rstrip("$").replace("\\", "")


def _fake(arg):
    class Match:
        def group(self, i):
            return None if i == 1 else arg

    return Match()


def _admin_object(name: str):
    from django.apps import apps

    app_label, _, rest = name.removeprefix("admin:").partition("_")
    if app_label not in apps.app_configs:
        return 1
    for model in apps.get_app_config(app_label).get_models():
        if rest.startswith(model._meta.model_name + "_"):
            obj = model._default_manager.first()
            return obj.pk if obj is not None else 1
    return 1


def outcome(response) -> str:
    code = response.status_code
    if code >= 500:
        return f"server error {code}"
    if code == 401 or (code == 302 and "login" in response.get("Location", "")):
        return "login"
    return {403: "denied", 404: "hidden", 405: "method"}.get(code, "answer")


def want(row, persona: str, method: str, name: str) -> str:
    if row == ADMIN_SITE:
        if name in ADMIN_PUBLIC:
            return "any"
        return "not login" if persona in ADMIN_HOLDERS else "login"
    public = name in ("login", "logout", "favicon") or name.startswith("api:")
    if not public and not name.startswith("admin:"):
        if persona == ANONYMOUS:
            return "login"
        if persona == NO_ROLE:
            return "denied"
    allowed = row[method]
    if allowed is None:
        return "method"
    if persona in allowed:
        return "answer"
    if persona in row["hidden_from"]:
        return "hidden"
    if name.startswith("admin:") or (name.startswith("api:") and persona == ANONYMOUS):
        return "login"
    return "denied"


def matches(got: str, wanted: str) -> bool:
    if got.startswith("server error"):
        return False
    if wanted == "any":
        return True
    if wanted == "not login":
        return got != "login"
    return got == wanted


class Signed:
    """A persona's client, signed in once: a fresh sign-in for each of some
    2,000 requests cost a third of this test. A response that sets or clears
    the session cookie (logging in or out, a new session key) gets the
    persona signed in afresh before the next URL, so each URL is still
    asked with the persona's own session."""

    def __init__(self, persona: str, people: dict):
        from django.test import Client

        self.persona, self.people = persona, people
        self.client = Client()
        self.stale = True

    def after(self, response) -> None:
        from django.conf import settings

        self.stale |= settings.SESSION_COOKIE_NAME in response.cookies

    def before_url(self) -> None:
        if self.stale:
            self.client.logout()
            if self.persona != ANONYMOUS:
                self.client.force_login(self.people[self.persona])
            self.stale = False


def test_each_role_gets_the_answer_its_role_allows(objects, people, settings):
    settings.TILEMATRIX_ANONYMOUS_READ = False
    wrong, pairs = [], 0
    signed = {persona: Signed(persona, people) for persona in PERSONAS}
    for route, name in url_patterns():
        row = expected(name)
        url = fill(route, name, objects)
        for persona in PERSONAS:
            signed[persona].before_url()
            client = signed[persona].client
            for method in METHODS:
                if method == "POST" and name in API_BODIES:
                    response = client.post(
                        url, API_BODIES[name], content_type="application/json"
                    )
                else:
                    response = getattr(client, method.lower())(url)
                signed[persona].after(response)
                got, wanted = outcome(response), want(row, persona, method, name)
                pairs += 1
                if not matches(got, wanted):
                    wrong.append(
                        f"{method} {url} ({name}) as {persona}: {got}, not {wanted}"
                    )
    print(f"{pairs} URL x role x method pairs checked")
    assert wrong == [], "\n".join(wrong)
    assert pairs > 2000
