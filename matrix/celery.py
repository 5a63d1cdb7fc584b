from __future__ import annotations

import os

from celery import Celery
from celery.signals import task_postrun, task_prerun

from runners.config import CELERY_DELIVERY
from runners.messages import limits_install

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "matrix.settings")

app = Celery("matrix")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.update(CELERY_DELIVERY)
limits_install()
app.autodiscover_tasks()


@task_prerun.connect
@task_postrun.connect
def database_connections_checked(sender=None, **_) -> None:
    """Around each task as around each request: a connection older than
    CONN_MAX_AGE, or one that failed and no longer answers (the database
    restarted), is closed, and the next query opens a new one; a healthy
    one is kept (settings.CELERY_DB_REUSE_MAX). Not for a task run eagerly,
    inside its caller's transaction."""
    from django.db import close_old_connections

    if getattr(getattr(sender, "request", None), "is_eager", False):
        return

    close_old_connections()
