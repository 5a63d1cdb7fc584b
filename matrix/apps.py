from __future__ import annotations

from django.apps import AppConfig


class MatrixConfig(AppConfig):
    name = "matrix"
    verbose_name = "TileMatrix"

    def ready(self):
        from django.db.models.signals import post_migrate

        from matrix import read_versions  # noqa: F401 (connects its receiver)
        from matrix.accounts.roles import roles_create
        from matrix.alerts import receivers as alerts  # noqa: F401 (connects them)
        from matrix.bisection import receivers as bisection_receivers  # noqa: F401
        from matrix.celery import app
        from matrix.gate import receivers  # noqa: F401 (connects them)
        from matrix.gate.tasks import RESEND_AFTER_S, ROUTES
        from matrix.notifications import receivers as notify  # noqa: F401
        from matrix.notifications.tasks import ROUTES as NOTIFY_ROUTES
        from matrix.notifications.tasks import WATCH_EVERY_S

        # After every app's migrations, not only this one's: the admin role
        # holds the permissions of apps migrated after it (axes). Connected
        # here, after django.contrib.auth's ready, so that it runs after
        # auth has created each app's permissions.
        post_migrate.connect(roles_create, dispatch_uid="roles_create")
        app.conf.task_routes = {
            **(app.conf.task_routes or {}),
            **ROUTES,
            **NOTIFY_ROUTES,
        }
        app.conf.beat_schedule = {
            **(app.conf.beat_schedule or {}),
            "gate.reevaluation_resend": {
                "task": "gate.reevaluation_resend",
                "schedule": RESEND_AFTER_S,
                "options": {"queue": "control"},
            },
            "notifications.runners_watch": {
                "task": "notifications.runners_watch",
                "schedule": WATCH_EVERY_S,
                "options": {"queue": "control"},
            },
        }
