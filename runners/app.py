"""The runner agent's Celery app: what ``tilematrix-runner work`` runs.

Configured from the environment alone (``runners.config``): the broker
(``CELERY_BROKER_URL``, embedded default under var/) and how messages are
delivered. It runs one task, ``runners.execute_job`` (``runners.jobs``), on
the queues the server gave the runner; ``RunnerHost`` adds the heartbeats,
recovery and outbox. What it sends the control worker goes by task name.
"""

from __future__ import annotations

import os

from celery import Celery

from runners import config, logs  # noqa: F401 (logs: JSON lines, request ids)
from runners.messages import limits_install
from runners.worker import RunnerHost

app = Celery("runners", include=["runners.jobs"])
_broker_url, _transport_options = config.parse_broker(
    os.environ.get("CELERY_BROKER_URL"),
    config.var_dir() / "broker",
    keyprefix=os.environ.get("TILEMATRIX_BROKER_KEYPREFIX"),
)
app.conf.update(
    config.CELERY_DELIVERY,
    broker_url=_broker_url,
    broker_transport_options=_transport_options,
    broker_transport=config.broker_transport(_broker_url),
)
app.steps["consumer"].add(RunnerHost)
limits_install()
