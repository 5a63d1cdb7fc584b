"""Each approved runner's own RabbitMQ login, limited to its own queues.

With one broker credential for the whole fleet, any runner host could read
every other runner's job messages and publish into their queues. When
``TILEMATRIX_BROKER_ADMIN_URL`` names RabbitMQ's management API, the server
instead gives each runner a user of its own when a runner admin approves it,
and deletes that user and closes its connections when the runner is revoked.

What a runner's user may do (RabbitMQ permission regexes; a regex matches
queue and exchange names alike):

- read: the queues it consumes (``runner.<name>``, its ``validate.*`` and
  ``compile.*`` queues), which the server declares for it, so it needs no
  configure permission on them (configure would let it delete a queue it
  shares with other runners);
- write: the ``control`` exchange (its results and heartbeats, never the
  control queue's messages: it cannot read them), its one ingest queue's
  exchange where the server has several (``ingest_queues``), and its own
  ``runner.<name>`` exchange (a job message it retries later comes back to
  it there); never the default exchange, which reaches every queue;
- configure, read and write: its own remote-control mailbox
  (``runner.<name>.pidbox``), through which its worker pauses and resumes
  its own consumers; Celery's shared ``celery.pidbox`` would let it stop
  any worker.

Its password is derived from the server's secret key, the user name and the
runner's public key, so the server keeps no copy and can give it again
whenever the runner's worker asks for its queues (over HTTPS, signed).

Redis and the embedded broker have no users: with them, or without the
admin URL, every runner uses the broker URL it was configured with, as
before.
"""

from __future__ import annotations

import json
import logging
import re
import urllib.error
import urllib.request
from base64 import b64encode
from urllib.parse import quote, unquote, urlsplit

from django.conf import settings
from django.utils.crypto import salted_hmac
from kombu import Connection

from matrix.fleet import ingest_queues
from runners.broker_login import mailbox
from runners.protocol import CONTROL

log = logging.getLogger(__name__)

ADMIN_TIMEOUT_S = 5
USER_PREFIX = "runner."
# A worker holds a few connections (consumer, publisher pool, the
# remote-control mailbox) with a channel or two each; a runner host running
# far more is misbehaving.
MAX_CONNECTIONS = 16
MAX_CHANNELS = 64


class BrokerAdminError(RuntimeError):
    """The management API refused or did not answer; the message says which
    call and why."""


def enabled() -> bool:
    return bool(settings.TILEMATRIX_BROKER_ADMIN_URL)


def vhost() -> str:
    """The virtual host of the server's own broker URL (``/`` for ``//`` or
    an empty path), where the runners' queues live."""
    path = urlsplit(settings.CELERY_BROKER_URL).path
    return unquote(path[1:]) if len(path) > 1 else "/"


def username(runner_name: str) -> str:
    """Unique per deployment: two deployments on one broker use two virtual
    hosts, and their runners may share names."""
    host = vhost()
    return f"{USER_PREFIX}{runner_name}" + ("" if host == "/" else f"@{host}")


def password(runner) -> str:
    """Derived, not stored: the same for the same runner and key for as long
    as the server's secret key is the same."""
    return salted_hmac(
        "tilematrix.broker-login",
        f"{username(runner.name)}\n{runner.public_key}",
        algorithm="sha256",
    ).hexdigest()


def login(runner) -> dict | None:
    """What the runner's worker connects with, or None when runners keep the
    broker URL they were configured with."""
    if not enabled():
        return None
    return {
        "username": username(runner.name),
        "password": password(runner),
        "vhost": vhost(),
    }


def permissions(runner) -> dict:
    name = re.escape(runner.name)
    # Its results go to the control exchange or to its one ingest queue's.
    sends = "|".join(
        re.escape(e)
        for e in dict.fromkeys([CONTROL, ingest_queues.of_runner(runner.name)])
    )
    # The worker's mailbox: its exchange, and its node queue, named after the
    # worker's host name (``<name>@<host>``, as `runner work` sets it).
    pidbox = rf"({name}@[^@]*\.)?{re.escape(mailbox(runner.name))}\.pidbox"
    return {
        "configure": f"^{pidbox}$",
        "write": f"^({pidbox}|{sends}|{re.escape(runner.queue)})$",
        "read": f"^({pidbox}|{'|'.join(re.escape(q) for q in runner.queues())})$",
    }


def _admin(method: str, path: str, body: dict | None = None):
    """Call the management API; the parsed JSON reply, or None for an empty
    one. A 404 on DELETE is success: it is gone already."""
    base = urlsplit(settings.TILEMATRIX_BROKER_ADMIN_URL)
    netloc = base.hostname + (f":{base.port}" if base.port else "")
    url = f"{base.scheme}://{netloc}{base.path.rstrip('/')}/api/{path}"
    credentials = f"{unquote(base.username or '')}:{unquote(base.password or '')}"
    request = urllib.request.Request(
        url,
        method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={
            "Authorization": "Basic " + b64encode(credentials.encode()).decode(),
            "Content-Type": "application/json",
            "X-Reason": "TileMatrix: runner revoked",
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=ADMIN_TIMEOUT_S) as answer:
            raw = answer.read()
    except urllib.error.HTTPError as exc:
        if method == "DELETE" and exc.code == 404:
            return None
        detail = exc.read()[:300].decode(errors="replace")
        raise BrokerAdminError(
            f"broker management API: {method} /api/{path} answered {exc.code}: {detail}"
        ) from None
    except OSError as exc:
        raise BrokerAdminError(
            f"broker management API at {netloc} did not answer "
            f"{method} /api/{path}: {exc}"
        ) from None
    return json.loads(raw) if raw else None


def _q(text: str) -> str:
    return quote(text, safe="")


def queues_declare(runner) -> None:
    """Declare the runner's queues and the control queue as the server's
    Celery declares them when it publishes (same exchange, binding and
    arguments): the runner's worker only reads them."""
    from matrix.celery import app

    with Connection(
        settings.CELERY_BROKER_URL, connect_timeout=ADMIN_TIMEOUT_S
    ) as connection:
        try:
            channel = connection.default_channel
            for name in dict.fromkeys(
                [CONTROL, ingest_queues.of_runner(runner.name), *runner.queues()]
            ):
                app.amqp.queues[name](channel).declare()
        except (
            OSError,
            *connection.connection_errors,
            *connection.channel_errors,
        ) as exc:
            raise BrokerAdminError(
                f"cannot declare runner {runner.name}'s queues: {exc}"
            ) from None


def access_grant(runner) -> None:
    """Create or update the runner's user, its permissions and limits, and
    its queues. Idempotent: asked again on every worker start, it repairs a
    broker that was reset or a secret key that changed."""
    if not enabled():
        return
    user = _q(username(runner.name))
    queues_declare(runner)
    _admin("PUT", f"users/{user}", {"password": password(runner), "tags": ""})
    _admin("PUT", f"permissions/{_q(vhost())}/{user}", permissions(runner))
    for limit, value in (
        ("max-connections", MAX_CONNECTIONS),
        ("max-channels", MAX_CHANNELS),
    ):
        _admin("PUT", f"user-limits/{user}/{limit}", {"value": value})


QUEUE_CAP_POLICY = "tilematrix-results-cap"


def queue_caps_ensure() -> None:
    """Bound the control queue and the ingest queues: past
    ``TILEMATRIX_CONTROL_QUEUE_MAX_MB`` each, RabbitMQ drops the oldest
    message, so a flood (a runner host misbehaving, control workers down
    for long) fills no broker disk. A result dropped is sent again from its
    runner's outbox while its job waits for it; a heartbeat dropped is
    followed by the next. A policy, not a queue argument: it applies to the
    queues already declared, and changing it needs no redeclaration."""
    if not enabled():
        return
    _admin(
        "PUT",
        f"policies/{_q(vhost())}/{QUEUE_CAP_POLICY}",
        {
            "pattern": rf"^({re.escape(CONTROL)}|{re.escape(ingest_queues.PREFIX)}[0-9]+)$",
            "definition": {
                "max-length-bytes": settings.TILEMATRIX_CONTROL_QUEUE_MAX_MB * 2**20
            },
            "apply-to": "queues",
            "priority": 0,
        },
    )


def access_revoke(runner_name: str) -> int:
    """Delete the runner's user (no new connection is accepted) and close
    the connections it has open; how many were closed."""
    if not enabled():
        return 0
    user = username(runner_name)
    _admin("DELETE", f"users/{_q(user)}")
    return _connections_close(user)


def _connections_close(user: str) -> int:
    # By user: RabbitMQ's connection tracking (what enforces the
    # max-connections limit) lists a connection as soon as it is open,
    # where GET /api/connections waits for the next statistics interval.
    path = f"connections/username/{_q(user)}"
    listed = _admin("GET", path) or []
    if listed:
        _admin("DELETE", path)
    return len(listed)


def users_prune(*, keep: set[str]) -> int:
    """Revoke the runner users with permissions on this deployment's
    virtual host whose runner is not in ``keep`` (runner names): a
    revocation whose broker part failed, a runner deleted. How many. Run by
    the reaper, so a revocation holds within a reap of the management API
    answering again."""
    if not enabled():
        return 0
    keep = {username(name) for name in keep}
    held = _admin("GET", f"vhosts/{_q(vhost())}/permissions") or []
    stale = {
        p["user"]
        for p in held
        if p["user"].startswith(USER_PREFIX) and p["user"] not in keep
    }
    for user in sorted(stale):
        _admin("DELETE", f"users/{_q(user)}")
        _connections_close(user)
    return len(stale)
