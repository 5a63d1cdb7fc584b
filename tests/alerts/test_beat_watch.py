"""Beat runs the runner watch: the control worker's beat (``manage.py control
work``, which starts Celery's ``--beat``) holds an entry for it every
minute on the control queue, and the entry, applied as beat applies it,
tells the subscribers of a runner gone silent."""

from __future__ import annotations

from datetime import timedelta

import pytest
from celery.beat import PersistentScheduler
from django.utils import timezone

from matrix.celery import app
from matrix.fleet.models import Runner
from matrix.models.notifications import Notification, Subscription

pytestmark = pytest.mark.django_db

ENTRY = "notifications.runners_watch"


@pytest.fixture
def scheduler(tmp_path):
    """Beat's scheduler as the control worker starts it, on a schedule file
    of its own."""
    beat = PersistentScheduler(app, schedule_filename=str(tmp_path / "beat"), lazy=True)
    beat.setup_schedule()
    yield beat
    beat.close()


def test_beat_holds_the_runner_watch_every_minute_on_the_control_queue(scheduler):
    entry = scheduler.schedule[ENTRY]

    assert entry.task == ENTRY and entry.task in app.tasks
    assert entry.schedule.run_every == timedelta(seconds=60)
    assert entry.options["queue"] == "control"
    # Just started: due within the minute; a minute after its last run, due.
    due, next_in = entry.is_due()
    assert not due and 0 < next_in <= 60
    entry.last_run_at = entry.default_now() - timedelta(seconds=61)
    assert entry.is_due()[0]


def test_the_entry_applied_as_beat_does_tells_of_a_silent_runner(
    scheduler, register, reviewer, settings
):
    Subscription.objects.create(
        user=reviewer, channel="email", email="r@x.org", topics=["runner"]
    )
    settings.TILEMATRIX_NOTIFY_RUNNER_OFFLINE_S = 600
    silent = register(name="silent-1").runner
    Runner.objects.filter(pk=silent.pk).update(
        state="offline", last_heartbeat=timezone.now() - timedelta(hours=1)
    )
    app.conf.task_always_eager = True
    try:
        scheduler.apply_entry(scheduler.schedule[ENTRY], producer=None)
    finally:
        app.conf.task_always_eager = False

    (subject,) = Notification.objects.values_list("subject", flat=True)
    assert "silent-1 has been offline for more than 10 minutes" in subject
