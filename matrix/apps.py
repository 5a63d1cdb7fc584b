from __future__ import annotations

from django.apps import AppConfig


class MatrixConfig(AppConfig):
    name = "matrix"
    verbose_name = "TileMatrix"

    def ready(self):
        from matrix.celery import app
        from matrix.gate import receivers  # noqa: F401 (connects them)
        from matrix.gate.tasks import RESEND_AFTER_S, ROUTES

        app.conf.task_routes = {**(app.conf.task_routes or {}), **ROUTES}
        app.conf.beat_schedule = {
            **(app.conf.beat_schedule or {}),
            "gate.reevaluation_resend": {
                "task": "gate.reevaluation_resend",
                "schedule": RESEND_AFTER_S,
                "options": {"queue": "control"},
            },
        }
