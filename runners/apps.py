from __future__ import annotations

import os

from django.apps import AppConfig


class RunnersConfig(AppConfig):
    name = "runners"
    verbose_name = "Runner hosts"

    def ready(self):
        from matrix.celery import app
        from runners.tasks import ROUTES
        from runners.worker import RunnerHost

        app.steps["consumer"].add(RunnerHost)
        app.conf.task_routes = {**(app.conf.task_routes or {}), **ROUTES}
        reap_every = float(os.environ.get("TILEMATRIX_REAP_S", 30))
        app.conf.beat_schedule = {
            **(app.conf.beat_schedule or {}),
            "runners.reap": {
                "task": "runners.reap",
                "schedule": reap_every,
                "options": {"queue": "control"},
            },
        }
