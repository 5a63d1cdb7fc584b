"""Messages waiting on the broker's queues, asked of the broker itself.

A passive declare answers a queue's depth on every transport: AMQP counts
it, Redis adds up its lists, the filesystem transport counts its files.
The question runs in a thread of its own with a deadline: a broker that
does not answer costs a scrape or a readiness probe ``timeout_s``, never
the probe itself."""

from __future__ import annotations

import threading

from django.conf import settings
from kombu import Connection


def broker_connection(timeout_s: float) -> Connection:
    """A connection to the broker the settings name, giving up after
    ``timeout_s`` where the transport lets it."""
    options = dict(settings.CELERY_BROKER_TRANSPORT_OPTIONS or {})
    if settings.CELERY_BROKER_URL.startswith("redis"):
        options.setdefault("socket_connect_timeout", timeout_s)
        options.setdefault("socket_timeout", timeout_s)
    return Connection(
        settings.CELERY_BROKER_URL,
        transport=settings.CELERY_BROKER_TRANSPORT,
        transport_options=options,
        connect_timeout=timeout_s,
    )


def _depths(queues: list[str], timeout_s: float) -> dict[str, int]:
    depths = {}
    with broker_connection(timeout_s) as conn:
        conn.ensure_connection(max_retries=1, interval_start=0, timeout=timeout_s)
        channel = conn.channel()
        try:
            for queue in queues:
                try:
                    _, depths[queue], _ = channel.queue_declare(queue, passive=True)
                except conn.channel_errors:
                    # Not declared, or (Redis) an empty list, which does not
                    # exist: no message waits there.
                    depths[queue] = 0
                    if not getattr(channel, "is_open", True):
                        channel = conn.channel()  # AMQP closes it on a 404
        finally:
            channel.close()
    return depths


def queue_depths(queues: list[str], *, timeout_s: float) -> tuple[dict | None, str]:
    """(messages per queue, "ok"), or (None, why) when the broker could not
    be asked within ``timeout_s``."""
    answer: dict = {}

    def ask():
        try:
            answer["depths"] = _depths(queues, timeout_s)
        except Exception as exc:
            answer["error"] = f"unreachable ({exc.__class__.__name__})"

    # A daemon: one stuck in a socket the transport gives no timeout to
    # must not hold a worker's exit.
    thread = threading.Thread(target=ask, name="broker-depths", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        return None, f"no answer within {timeout_s:g} s"
    if "error" in answer:
        return None, answer["error"]
    return answer["depths"], "ok"
