"""Runners that need a person: approved ones silent for longer than
TILEMATRIX_NOTIFY_RUNNER_OFFLINE_S, and registered ones waiting for approval
longer than TILEMATRIX_NOTIFY_RUNNER_PENDING_S. Beat asks every minute; each
silence and each wait is told once (its message key names it)."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from matrix.fleet.models import Runner, RunnerHealth, RunnerState
from matrix.notifications.messages import runner_publish


def _minutes(seconds: float) -> str:
    minutes = round(seconds / 60)
    return f"{minutes} minute{'s' if minutes != 1 else ''}"


def runners_watch(now=None) -> list[str]:
    """Publish what is due; the runner names told."""
    now = now or timezone.now()
    offline_s = settings.TILEMATRIX_NOTIFY_RUNNER_OFFLINE_S
    pending_s = settings.TILEMATRIX_NOTIFY_RUNNER_PENDING_S
    told = []
    silent = (
        Runner.objects.filter(
            revoked_at__isnull=True,
            health=RunnerHealth.ACTIVE,
            state=RunnerState.OFFLINE,
            last_heartbeat__lt=now - timedelta(seconds=offline_s),
        )
        .prefetch_related("device_types")
        .order_by("name")
    )
    for runner in silent:
        runner_publish(
            runner,
            why=f"has been offline for more than {_minutes(offline_s)} (last "
            f"heartbeat {runner.last_heartbeat:%Y-%m-%d %H:%M} UTC)",
            # One message per silence: the next one has another last heartbeat.
            key=f"runner:{runner.pk}:offline:{runner.last_heartbeat.isoformat()}",
        )
        told.append(runner.name)
    waiting = (
        Runner.objects.filter(
            revoked_at__isnull=True,
            health=RunnerHealth.PENDING,
            created_at__lt=now - timedelta(seconds=pending_s),
        )
        .prefetch_related("device_types")
        .order_by("name")
    )
    for runner in waiting:
        runner_publish(
            runner,
            why=f"has waited for approval for more than {_minutes(pending_s)}",
            key=f"runner:{runner.pk}:pending",
        )
        told.append(runner.name)
    return told
