from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import path

from matrix.api import api
from matrix.views import cells, errors, gaps, matrix, runners

urlpatterns = [
    path("", matrix.matrix_page, name="matrix"),
    path("gaps/", gaps.gaps_page, name="gaps"),
    path("gaps/run/", gaps.gaps_run, name="gaps-run"),
    path("sweeps/<int:pk>/", gaps.sweep_page, name="sweep"),
    path("cells/<int:shape_id>/<int:device_type_id>/", cells.cell_page, name="cell"),
    path(
        "cells/<int:shape_id>/<int:device_type_id>/job.json",
        cells.cell_job,
        name="cell-job",
    ),
    path("errors/", errors.errors_page, name="errors"),
    path("runners/", runners.runners_page, name="runners"),
    path("runners/tokens/", runners.runner_token_create, name="runner-token"),
    path("runners/<int:pk>/health/", runners.runner_health, name="runner-health"),
    path("runners/<int:pk>/revoke/", runners.runner_revoke, name="runner-revoke"),
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("api/v1/", api.urls),
]
