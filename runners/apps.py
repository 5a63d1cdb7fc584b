from __future__ import annotations

import os
from pathlib import Path

from django.apps import AppConfig
from django.conf import settings
from django.contrib.admin import apps as admin_apps


class RunnersConfig(AppConfig):
    name = "runners"
    verbose_name = "Runner hosts"

    def ready(self):
        from django.db.models.signals import post_migrate

        from matrix.celery import app
        from runners.roles import roles_create
        from runners.tasks import ROUTES
        from runners.worker import RunnerHost

        # After every app's migrations, not only this one's: the admin role
        # holds the permissions of apps migrated after it (axes).
        post_migrate.connect(roles_create, dispatch_uid="roles_create")

        app.steps["consumer"].add(RunnerHost)
        app.conf.task_routes = {**(app.conf.task_routes or {}), **ROUTES}
        if app.conf.broker_url.startswith("filesystem"):
            # The filesystem broker is polled; its 1 s default made each job of
            # a demo sweep wait up to a second for delivery.
            # Its exchange bindings go under var/, not into the current
            # directory, which is kombu's default.
            options = app.conf.broker_transport_options or {}
            app.conf.broker_transport_options = {
                "polling_interval": 0.1,
                "control_folder": str(
                    Path(options["data_folder_out"]).parent / "control"
                ),
                **options,
            }
        prefix = os.environ.get("TILEMATRIX_BROKER_KEYPREFIX")
        if prefix and app.conf.broker_url.startswith(("redis", "rediss")):
            # Several deployments (or test runs) sharing one Redis keep to
            # their own keys: the same queue names would otherwise cross.
            app.conf.broker_transport_options = {
                **(app.conf.broker_transport_options or {}),
                "global_keyprefix": prefix,
            }
        app.conf.beat_schedule = {
            **(app.conf.beat_schedule or {}),
            "runners.reap": {
                "task": "runners.reap",
                "schedule": settings.TILEMATRIX_REAP_S,
                # The reaper reads heartbeats as the control worker stored
                # them, and a heartbeat waits in the same queue as the reap:
                # a reap that waited longer (behind a control worker killed
                # mid-ingest, with the heartbeat it held) would find a live
                # runner silent. It is dropped; the next one comes soon.
                "options": {
                    "queue": "control",
                    "expires": settings.TILEMATRIX_HEARTBEAT_S,
                },
            },
        }


class RoleAdminConfig(admin_apps.AdminConfig):
    """The admin site behind the admin role (``runners.roles``)."""

    default = False
    default_site = "runners.roles.RoleAdminSite"
