from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.templatetags.static import static
from django.urls import path, register_converter
from django.urls.converters import IntConverter
from django.views.generic import RedirectView

from matrix.api import api
from matrix.views import (
    account,
    alerts,
    bisections,
    cells,
    errors,
    gaps,
    matrix,
    models,
    notifications,
    operators,
    revisions,
    runners,
    submissions,
    upgrades,
)


class IdConverter(IntConverter):
    """A row id: at most 18 digits, so every one fits a 64-bit key. A longer
    number in a path is no page (404), not an id SQLite cannot compare."""

    regex = "[0-9]{1,18}"


register_converter(IdConverter, "id")


urlpatterns = [
    path("", matrix.matrix_page, name="matrix"),
    path("matrix.csv", matrix.matrix_csv, name="matrix-csv"),
    path("models/", models.models_page, name="models"),
    path("models.csv", models.models_csv, name="models-csv"),
    path("operators/<slug:name>/", operators.operator_page, name="operator"),
    path(
        "operators/<slug:name>/revisions/",
        revisions.revisions_page,
        name="operator-revisions",
    ),
    path(
        "operators/<slug:name>/revisions/revert/",
        revisions.revision_revert,
        name="operator-revert",
    ),
    path("gaps/", gaps.gaps_page, name="gaps"),
    path("gaps/run/", gaps.gaps_run, name="gaps-run"),
    path("gaps/neighbours/", gaps.gaps_neighbours, name="gaps-neighbours"),
    path("gaps.csv", gaps.gaps_csv, name="gaps-csv"),
    path("sweeps/<id:pk>/", gaps.sweep_page, name="sweep"),
    path("cells/<id:shape_id>/<id:device_type_id>/", cells.cell_page, name="cell"),
    path(
        "cells/<id:shape_id>/<id:device_type_id>/job.json",
        cells.cell_job,
        name="cell-job",
    ),
    path("errors/", errors.errors_page, name="errors"),
    path("alerts/", alerts.alerts_page, name="alerts"),
    path("alerts/<id:pk>/", alerts.alert_page, name="alert"),
    path("alerts/<id:pk>/triage/", alerts.alert_triage_view, name="alert-triage"),
    path("alerts/<id:pk>/bisect/", alerts.alert_bisect_view, name="alert-bisect"),
    path("notifications/", notifications.notifications_page, name="notifications"),
    path(
        "notifications/<id:pk>/test/",
        notifications.subscription_test,
        name="subscription-test",
    ),
    path(
        "notifications/<id:pk>/stop/",
        notifications.subscription_stop,
        name="subscription-stop",
    ),
    path("runners/", runners.runners_page, name="runners"),
    path("runners/tokens/", runners.runner_token_create, name="runner-token"),
    path("runners/<id:pk>/health/", runners.runner_health, name="runner-health"),
    path("runners/<id:pk>/approve/", runners.runner_approve, name="runner-approve"),
    path("runners/<id:pk>/refuse/", runners.runner_refuse, name="runner-refuse"),
    path("runners/<id:pk>/revoke/", runners.runner_revoke, name="runner-revoke"),
    path("upgrades/", upgrades.upgrades_page, name="upgrades"),
    path("upgrades/new/", upgrades.upgrade_new, name="upgrade-new"),
    path("upgrades/policy/", upgrades.policy_page, name="upgrade-policy"),
    path("upgrades/<id:pk>/", upgrades.upgrade_page, name="upgrade"),
    path("upgrades/<id:pk>/decide/", upgrades.upgrade_decide, name="upgrade-decide"),
    path(
        "upgrades/<id:pk>/reevaluate/",
        upgrades.upgrade_reevaluate,
        name="upgrade-reevaluate",
    ),
    path("upgrades/<id:pk>/rollout/", upgrades.upgrade_rollout, name="upgrade-rollout"),
    path(
        "upgrades/<id:pk>/exceptions/",
        upgrades.upgrade_exception,
        name="upgrade-exception",
    ),
    path(
        "upgrades/exceptions/<id:pk>/sign-off/",
        upgrades.exception_sign_off,
        name="upgrade-exception-sign-off",
    ),
    path("upgrades/<id:pk>/bisect/", bisections.upgrade_bisect, name="upgrade-bisect"),
    path("bisections/<id:pk>/", bisections.bisection_page, name="bisection"),
    path("submissions/", submissions.submissions_page, name="submissions"),
    path("submissions/new/", submissions.submission_new, name="submission-new"),
    path("submissions/<id:pk>/", submissions.submission_page, name="submission"),
    path(
        "submissions/<id:pk>/review/",
        submissions.submission_review,
        name="submission-review",
    ),
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", account.LogoutView.as_view(), name="logout"),
    # Pages without the app's <link rel="icon"> (the admin's) ask for this.
    path(
        "favicon.ico",
        RedirectView.as_view(url=static("favicon.svg"), permanent=True),
        name="favicon",
    ),
    path("admin/", admin.site.urls),
    path("api/v1/", api.urls),
]
