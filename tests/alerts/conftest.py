"""Alert fixtures: a CPU runner and its cells, served shapes that pass, and
helpers that play the runner's side through real ingest (signed results),
so alerts are opened exactly as in production. A real SMTP server
(aiosmtpd) and a real HTTP receiver on localhost take the messages."""

from __future__ import annotations

import hashlib
import json
import socket
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.utils import timezone

from matrix.fleet import services
from matrix.models import (
    DeviceType,
    JobState,
    KernelRevision,
    Shape,
    Toolchain,
    ValidationJob,
)
from matrix.revisions import make_current
from matrix.services import shape_import
from tests.runners.conftest import (  # noqa: F401 (fixtures)
    CPU_COMPONENTS,
    cpu_inventory,
    cpu_runner,
    register,
    server_key_file,
)

COMPILE_ERROR = {
    "error": {"message": "LLVM ERROR: cannot select fadd", "signature": "sig-release"}
}


def served_shapes(count: int, profile: str = "alert-flood") -> list[Shape]:
    """``count`` served elementwise_add shapes, of weight 1 each."""
    shape_import(
        rows=[
            ("elementwise_add", {"M": m, "N": 16}, "float32", 1.0)
            for m in range(1, count + 1)
        ],
        source_profile=profile,
        served=True,
    )
    return list(Shape.objects.filter(source_profile=profile).order_by("pk"))


def claimed(runner, shapes) -> list[ValidationJob]:
    """One validate job per shape on the CPU, claimed by ``runner``. All
    at once, as a runner's many workers would: one claim a job costs a
    second at 500 jobs and tells nothing more here."""
    cpu = DeviceType.objects.get(backend="c")
    toolchain = Toolchain.objects.get(name="tilelang-0.1.15-cpu")
    sweep = services.sweep_plan(cells=[(s, cpu, toolchain) for s in shapes])
    ValidationJob.objects.filter(sweep=sweep).update(
        state=JobState.RUNNING, runner=runner.runner, started_at=timezone.now()
    )
    return list(sweep.jobs.order_by("pk"))


def ingest(runner, jobs, status=None, **fields):
    outcomes = services.results_ingest(
        envelopes=[runner.result(job, status=status, **fields) for job in jobs]
    )
    assert {o.status for o in outcomes} == {"stored"}, {o.reason for o in outcomes}
    return [o.result for o in outcomes]


def new_revision(operator_name: str = "elementwise_add", backend: str = "c"):
    """A new revision of the operator, made current on ``backend``."""
    current = KernelRevision.objects.filter(operator__name=operator_name).first()
    revision = KernelRevision.objects.create(
        operator=current.operator,
        source_sha256=hashlib.sha256(
            f"{operator_name} {timezone.now().isoformat()}".encode()
        ).hexdigest(),
        origin="library",
        review_state="approved",
    )
    make_current(revision, [backend])
    return revision


@pytest.fixture
def green(cpu_runner):  # noqa: F811 (the fixture imported above)
    """``green(n)``: n served CPU cells that passed; their shapes."""

    def make(count: int, profile: str = "alert-flood"):
        shapes = served_shapes(count, profile)
        ingest(cpu_runner, claimed(cpu_runner, shapes))
        return shapes

    return make


RELEASES = ("0.1.13", "0.1.14", "0.1.15")


@pytest.fixture
def lab(register):  # noqa: F811 (the fixture imported above)
    """A CPU runner hosting TileLang 0.1.13 (the current toolchain), 0.1.14
    and 0.1.15; the toolchains by release."""
    inventory = cpu_inventory()
    inventory["toolchains"] = [
        {
            "name": f"tilelang-{version}-cpu",
            "interpreter": f"/opt/tilelang-{version}/bin/python",
            "components": {**CPU_COMPONENTS, "tilelang": version},
            "fingerprint": str(i) * 64,
        }
        for i, version in enumerate(RELEASES, start=1)
    ]
    hand = register(name="cpu-lab", inventory=inventory)
    toolchains = {t.tilelang_version: t for t in hand.runner.toolchains.all()}
    assert set(toolchains) == set(RELEASES)
    Toolchain.objects.filter(pk=toolchains["0.1.13"].pk).update(is_current=True)
    return hand, toolchains


def run(hand, shapes, toolchain, status=None, **fields):
    cpu = DeviceType.objects.get(backend="c")
    sweep = services.sweep_plan(cells=[(s, cpu, toolchain) for s in shapes])
    ValidationJob.objects.filter(sweep=sweep).update(
        state=JobState.RUNNING, runner=hand.runner, started_at=timezone.now()
    )
    return ingest(hand, list(sweep.jobs.order_by("pk")), status=status, **fields)


@pytest.fixture
def deliveries_run(django_capture_on_commit_callbacks):
    """Run what commits enqueue, the deliveries among them, in place (the
    Celery app eager), as the control worker would."""
    from matrix.celery import app

    app.conf.task_always_eager = True

    def run(fn, *args, **kwargs):
        with django_capture_on_commit_callbacks(execute=True):
            return fn(*args, **kwargs)

    yield run
    app.conf.task_always_eager = False


class Inbox:
    """Messages a real SMTP server on localhost took."""

    def __init__(self):
        self.messages = []

    async def handle_DATA(self, server, session, envelope):
        self.messages.append(
            {
                "to": envelope.rcpt_tos,
                "body": envelope.content.decode("utf-8", "replace"),
            }
        )
        return "250 OK"


@contextmanager
def smtp_server():
    """A real SMTP server on a free localhost port: (inbox, port)."""
    from aiosmtpd.controller import Controller

    inbox = Inbox()
    # aiosmtpd checks its server by connecting to the port it was given: a
    # free one is found first (port 0 would be connected to as such).
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    controller = Controller(inbox, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        yield inbox, port
    finally:
        controller.stop()


@pytest.fixture
def smtp(settings):
    """An SMTP server on a free localhost port, Django's mail pointed at it."""
    with smtp_server() as (inbox, port):
        settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
        settings.EMAIL_HOST = "127.0.0.1"
        settings.EMAIL_PORT = port
        settings.EMAIL_USE_TLS = False
        yield inbox


class Hooks:
    """What a real HTTP server on localhost received, and what it answers."""

    def __init__(self):
        self.requests = []
        self.answers = []  # status codes to answer first, then 200

    def url(self, server) -> str:
        host, port = server.server_address[:2]
        return f"http://{host}:{port}/hook"


@contextmanager
def hook_server():
    """A real HTTP server on localhost taking webhooks: its Hooks."""
    received = Hooks()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            # Headers as HTTP has them: case-insensitive.
            received.requests.append(
                {"headers": self.headers, "body": body, "json": json.loads(body)}
            )
            status = received.answers.pop(0) if received.answers else 200
            self.send_response(status)
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    received.address = received.url(server)
    try:
        yield received
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def hooks():
    with hook_server() as received:
        yield received
