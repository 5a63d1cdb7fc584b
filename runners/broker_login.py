"""A runner worker on its own broker login: where the server gives each
runner a RabbitMQ user of its own (``broker`` in its queues reply), that
user may read only the runner's queues, publish only to the control
exchange and its own queue's exchange, and use only its own remote-control
mailbox (``matrix/fleet/broker_access.py`` says why each). Celery's
defaults reach past that, so the worker is set up to stay inside it:

- its queues are declared by the server and only consumed here
  (``no_declare``): declaring them needs the configure permission, which
  would also let a runner delete a queue it shares with other runners;
- what it sends the control worker goes to the ``control`` exchange (or its
  ingest queue's) by name, not to the default exchange (which reaches every
  queue);
- a job message it retries comes back through its own queue's exchange;
- its remote-control mailbox is ``runner.<name>.pidbox``, not the shared
  ``celery.pidbox`` through which it could stop any worker.

The host, port and TLS of the broker stay the runner's own
``CELERY_BROKER_URL``: the server gives the user, password and virtual host.
"""

from __future__ import annotations

import os
from urllib.parse import quote, urlsplit, urlunsplit

from kombu import Exchange, Queue

from runners.protocol import CONTROL, INGEST_QUEUE, PUBLISH_BY_NAME

AMQP_SCHEMES = ("amqp", "amqps", "pyamqp")
# A Celery setting of this project's own, read by jobs.execute_job: the
# exchange and routing key a retried job message is published with.
RETRY_ROUTE = "tilematrix_retry_route"


class LoginUnusable(ValueError):
    """The runner's broker URL cannot carry the login the server gave."""


def url_with_login(base: str | None, login: dict) -> str:
    """``base`` (the runner's CELERY_BROKER_URL) with the server's user,
    password and virtual host in place of its own."""
    parts = urlsplit(base or "")
    if parts.scheme not in AMQP_SCHEMES or not parts.hostname:
        raise LoginUnusable(
            "the server gives this runner a RabbitMQ user of its own: set "
            "CELERY_BROKER_URL to the fleet's broker, amqp://HOST:5672/ (the "
            f"user and password come from the server), not {parts.scheme or 'unset'!r}"
        )
    host = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
    port = f":{parts.port}" if parts.port else ""
    userinfo = (
        f"{quote(login['username'], safe='')}:{quote(login['password'], safe='')}"
    )
    path = "/" + quote(login["vhost"], safe="")
    return urlunsplit((parts.scheme, f"{userinfo}@{host}{port}", path, "", ""))


def mailbox(runner_name: str) -> str:
    """The runner's remote-control namespace (its pidbox exchange is this
    and ``.pidbox``); the server grants the same name."""
    return f"runner.{runner_name}"


def app_isolate(
    app, *, runner_name: str, queues: list[str], login: dict, base_url: str | None
) -> None:
    """Set ``app`` (the agent's, before its worker starts) to work on the
    runner's own login and inside its permissions; the login goes into this
    process's CELERY_BROKER_URL too (a harness child's environment is an
    allow-list without it)."""
    own = f"runner.{runner_name}"
    url = url_with_login(base_url, login)
    # Celery reads CELERY_BROKER_URL from the environment over its setting.
    os.environ["CELERY_BROKER_URL"] = url
    app.conf.update(
        broker_url=url,
        task_queues=[
            Queue(name, Exchange(name, no_declare=True), name, no_declare=True)
            for name in dict.fromkeys(
                [*queues, CONTROL, app.conf.get(INGEST_QUEUE) or CONTROL]
            )
        ],
        control_exchange=mailbox(runner_name),
        **{
            PUBLISH_BY_NAME: True,
            RETRY_ROUTE: {"exchange": own, "routing_key": own},
        },
    )
