"""Each approved runner has a RabbitMQ user of its own, limited to its own
queues, and revoking the runner ends its broker access at once (issue 40,
part 3). Against the real RabbitMQ on 127.0.0.1 (AMQP 5672, management API
15672), in a virtual host of each test's own; the permission checks use
kombu directly, as a runner host's key holder could."""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
import uuid
from base64 import b64encode

import pytest
from amqp.exceptions import AccessRefused
from django.core.exceptions import ValidationError
from django.test import override_settings
from kombu import Connection, Producer

from matrix.fleet import broker_access, services
from matrix.fleet.models import Runner
from matrix.fleet.tasks import reap
from runners import broker_login

from .conftest import cpu_inventory

ADMIN = "http://guest:guest@127.0.0.1:15672/"
AMQP = "amqp://guest:guest@127.0.0.1:5672/"
H200 = {"vendor": "NVIDIA", "model": "H200", "arch": "sm_90a", "backend": "cuda"}


def admin(method: str, path: str, body=None):
    request = urllib.request.Request(
        "http://127.0.0.1:15672/api/" + path,
        method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={
            "Authorization": "Basic " + b64encode(b"guest:guest").decode(),
            "Content-Type": "application/json",
        },
    )
    with urllib.request.urlopen(request, timeout=5) as answer:
        raw = answer.read()
    return json.loads(raw) if raw else None


@pytest.fixture
def vhost():
    """A virtual host for the test (the guest user that makes it may use
    it), deleted afterwards with the runner users made in it: the users of
    one test's runners, whose rows the next test does not have, would be
    pruned there."""
    try:
        admin("GET", "overview")
    except OSError as exc:
        if os.environ.get("TILEMATRIX_REQUIRE_RABBITMQ"):
            raise
        pytest.skip(f"RabbitMQ's management API is not on 127.0.0.1:15672: {exc}")
    name = f"tm-test-{uuid.uuid4().hex[:8]}"
    admin("PUT", f"vhosts/{name}")
    yield name
    for user in admin("GET", f"vhosts/{name}/permissions"):
        if user["user"].startswith(broker_access.USER_PREFIX):
            admin("DELETE", f"users/{broker_access._q(user['user'])}")
    admin("DELETE", f"vhosts/{name}")


@pytest.fixture
def rabbit(vhost):
    with override_settings(
        CELERY_BROKER_URL=AMQP + vhost, TILEMATRIX_BROKER_ADMIN_URL=ADMIN
    ):
        yield vhost


@pytest.fixture
def two_runners(rabbit, register):
    """Runner A (a CPU) and runner B (an H200), both approved through the
    server's own approval, each with its own login."""
    suffix = uuid.uuid4().hex[:6]
    inventory_b = cpu_inventory()
    inventory_b["devices"] = [H200]
    a = register(name=f"a-{suffix}")
    b = register(name=f"b-{suffix}", inventory=inventory_b)
    return a, b


def login_url(hand) -> str:
    reply = services.runner_queues(envelope=hand.request("queues"))
    return broker_login.url_with_login("amqp://127.0.0.1:5672/", reply["broker"])


def connect(url: str) -> Connection:
    # Publisher confirms: a publish the broker refuses raises here, not on
    # some later call.
    return Connection(url, transport_options={"confirm_publish": True})


def refused(action) -> str:
    with pytest.raises(AccessRefused) as caught:
        action()
    return str(caught.value)


def consume(url: str, queue: str) -> None:
    with connect(url) as connection:
        connection.default_channel.basic_consume(queue, callback=lambda m: None)


def publish(url: str, exchange: str, routing_key: str, body=None) -> None:
    with connect(url) as connection:
        Producer(connection.default_channel).publish(
            body or {"forged": True}, exchange=exchange, routing_key=routing_key
        )


def depth(vhost: str, queue: str) -> int:
    # The management API counts messages a moment after they arrive.
    with connect(AMQP + vhost) as connection:
        return connection.default_channel.queue_declare(queue, passive=True)[1]


def test_approval_gives_a_runner_a_login_for_its_own_queues(two_runners, rabbit):
    a, _ = two_runners
    reply = services.runner_queues(envelope=a.request("queues"))

    assert reply["broker"]["username"] == f"runner.{a.name}@{rabbit}"
    assert reply["broker"]["vhost"] == rabbit
    with connect(login_url(a)) as connection:
        channel = connection.default_channel
        for queue in reply["queues"]:
            # Declared by the server at approval: present, and readable.
            channel.basic_consume(queue, callback=lambda m: None)


def test_a_runner_cannot_consume_another_runners_queues(two_runners):
    a, b = two_runners
    url = login_url(a)
    b_only = set(b.runner.queues()) - set(a.runner.queues())
    assert b.runner.queue in b_only and any(q.startswith("validate.") for q in b_only)

    for queue in sorted(b_only):
        assert "ACCESS_REFUSED" in refused(lambda q=queue: consume(url, q))
    # Nor the control queue: other runners' results and heartbeats.
    assert "ACCESS_REFUSED" in refused(lambda: consume(url, "control"))


def test_a_runner_cannot_publish_to_another_runners_queues(two_runners, rabbit):
    a, b = two_runners
    url = login_url(a)

    # The default exchange reaches every queue by name.
    assert "amq.default" in refused(lambda: publish(url, "", b.runner.queue))
    for queue in b.runner.queues():
        assert "ACCESS_REFUSED" in refused(lambda q=queue: publish(url, q, q))
    assert depth(rabbit, b.runner.queue) == 0


def test_a_runner_cannot_delete_or_purge_a_queue_it_shares(two_runners, rabbit):
    a, b = two_runners
    shared = sorted(set(a.runner.queues()) & set(b.runner.queues()))
    assert shared  # the compile-only queue of their common toolchain
    url = login_url(a)

    with connect(url) as connection:
        channel = connection.default_channel
        assert "ACCESS_REFUSED" in refused(lambda: channel.queue_delete(shared[0]))
    with connect(url) as connection:
        channel = connection.default_channel
        assert "ACCESS_REFUSED" in refused(lambda: channel.queue_purge("control"))


def test_a_runner_publishes_to_the_control_queue_and_its_own_queue(two_runners, rabbit):
    a, _ = two_runners
    url = login_url(a)
    before = depth(rabbit, "control")

    publish(url, "control", "control")
    publish(url, a.runner.queue, a.runner.queue)

    assert depth(rabbit, "control") == before + 1
    with connect(url) as connection:
        message = connection.default_channel.basic_get(a.runner.queue)
        assert message is not None and json.loads(message.body) == {"forged": True}


def test_with_two_ingest_queues_a_runner_publishes_to_its_own_and_reads_neither(
    two_runners, rabbit
):
    a, _ = two_runners
    with override_settings(TILEMATRIX_INGEST_QUEUES=2):
        # Asked again at each worker start: the login follows the setting.
        reply = services.runner_queues(envelope=a.request("queues"))
        own = reply["ingest"]
        other = {"ingest.0": "ingest.1", "ingest.1": "ingest.0"}[own]
        url = broker_login.url_with_login("amqp://127.0.0.1:5672/", reply["broker"])
        before = depth(rabbit, own)

        publish(url, own, own)

        assert depth(rabbit, own) == before + 1
        assert "ACCESS_REFUSED" in refused(lambda: publish(url, other, other))
        assert "ACCESS_REFUSED" in refused(lambda: consume(url, own))


def test_the_control_and_ingest_queues_are_capped_dropping_the_oldest(rabbit):
    from matrix.celery import app

    with override_settings(TILEMATRIX_CONTROL_QUEUE_MAX_MB=1):
        broker_access.queue_caps_ensure()
        broker_access.queue_caps_ensure()  # again: the same policy
    (policy,) = admin("GET", f"policies/{rabbit}")
    assert policy["definition"] == {"max-length-bytes": 2**20}
    with connect(AMQP + rabbit) as connection:
        channel = connection.default_channel
        for name in ("control", "ingest.3", "runner.a"):
            app.amqp.queues[name](channel).declare()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(
        q.get("effective_policy_definition", {}).get("max-length-bytes") != 2**20
        for q in admin("GET", f"queues/{rabbit}")
        if q["name"] != "runner.a"
    ):
        time.sleep(0.2)

    body = {"results": "x" * 400_000}
    for queue in ("control", "ingest.3", "runner.a"):
        for _ in range(4):
            publish(AMQP + rabbit, queue, queue, body)

    # 1 MB holds two of these; the two oldest are gone. A runner's job queue
    # is not the policy's.
    assert depth(rabbit, "control") == 2
    assert depth(rabbit, "ingest.3") == 2
    assert depth(rabbit, "runner.a") == 4


def test_revoking_a_runner_drops_its_connection_and_refuses_new_ones(
    two_runners, rabbit
):
    a, b = two_runners
    url_a, url_b = login_url(a), login_url(b)
    with connect(url_a) as held, connect(url_b) as other:
        held.default_channel.basic_consume(a.runner.queue, callback=lambda m: None)
        other.default_channel.basic_consume(b.runner.queue, callback=lambda m: None)

        started = time.monotonic()
        revoked = services.runner_revoke(name=a.name)
        took = time.monotonic() - started

        assert revoked.broker_connections_closed == 1
        # The open connection is closed by the broker: the next read on it
        # finds it gone.
        with pytest.raises(held.connection_errors):
            held.drain_events(timeout=2)
        # B is untouched.
        with pytest.raises(TimeoutError):
            other.drain_events(timeout=0.5)
    assert took < 5, f"revocation took {took:.1f} s: longer than a heartbeat"
    assert "ACCESS_REFUSED" in refused(lambda: consume(url_a, a.runner.queue))


def test_the_reaper_deletes_the_broker_user_of_a_runner_revoked_while_the_broker_was_away(
    two_runners, rabbit
):
    a, b = two_runners
    url_a = login_url(a)
    with override_settings(
        TILEMATRIX_BROKER_ADMIN_URL="http://guest:guest@127.0.0.1:1/"
    ):
        revoked = services.runner_revoke(name=a.name)
    assert revoked.broker_connections_closed is None
    consume(url_a, a.runner.queue)  # still works: the broker was not told

    reap()  # the control worker's beat runs it every TILEMATRIX_REAP_S

    assert "ACCESS_REFUSED" in refused(lambda: consume(url_a, a.runner.queue))
    consume(login_url(b), b.runner.queue)


def test_approval_is_refused_when_the_broker_user_cannot_be_made(rabbit, register):
    pending = register(name=f"p-{uuid.uuid4().hex[:6]}", approved=False)
    with (
        override_settings(
            TILEMATRIX_BROKER_ADMIN_URL="http://guest:guest@127.0.0.1:1/"
        ),
        pytest.raises(ValidationError, match="broker user could not be made"),
    ):
        services.runner_approve(name=pending.name)
    assert Runner.objects.get(name=pending.name).health == Runner.Health.PENDING


LOGIN = {"username": "runner.h200-a@lab", "password": "p/w:1", "vhost": "lab"}


def test_the_runner_keeps_its_broker_address_and_takes_the_servers_login():
    url = broker_login.url_with_login("amqps://old:creds@rabbit.lab:5671//", LOGIN)
    assert url == "amqps://runner.h200-a%40lab:p%2Fw%3A1@rabbit.lab:5671/lab"
    connection = Connection(url)
    assert (connection.userid, connection.password) == ("runner.h200-a@lab", "p/w:1")
    assert (connection.hostname, connection.port, connection.virtual_host) == (
        "rabbit.lab",
        5671,
        "lab",
    )


@pytest.mark.parametrize("base", [None, "", "redis://r:6379/0", "filesystem://"])
def test_a_login_on_a_runner_without_a_rabbitmq_url_is_refused_with_the_fix(base):
    with pytest.raises(broker_login.LoginUnusable, match="CELERY_BROKER_URL"):
        broker_login.url_with_login(base, LOGIN)
