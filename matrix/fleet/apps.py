from __future__ import annotations

from django.apps import AppConfig
from django.conf import settings


class FleetConfig(AppConfig):
    """Runner hosts as the server sees them: registration, liveness, planning
    and ingest. Its label is still ``runners``, the package these models
    lived in before the runner agent left the server: the label names the
    tables, the migrations and the permissions (``runners.approve_runner``),
    so every row and every role's grant stays as it was."""

    name = "matrix.fleet"
    label = "runners"
    verbose_name = "Runner hosts"

    def ready(self):
        from matrix.celery import app
        from matrix.fleet.tasks import ROUTES
        from runners.protocol import CONTROL, REAP

        app.conf.task_routes = {**(app.conf.task_routes or {}), **ROUTES}
        app.conf.beat_schedule = {
            **(app.conf.beat_schedule or {}),
            REAP: {
                "task": REAP,
                "schedule": settings.TILEMATRIX_REAP_S,
                # The reaper reads heartbeats as the control worker stored
                # them, and a heartbeat waits in the same queue as the reap:
                # a reap that waited longer (behind a control worker killed
                # mid-ingest, with the heartbeat it held) would find a live
                # runner silent. It is dropped; the next one comes soon.
                "options": {
                    "queue": CONTROL,
                    "expires": settings.TILEMATRIX_HEARTBEAT_S,
                },
            },
        }
