from __future__ import annotations

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
