"""Every API answer is strict JSON: no NaN, Infinity or -Infinity, which
JSON.parse and most other parsers refuse (issue 20: GET /api/v1/matrix had
answered "kernel_ms": Infinity). Each operation of the OpenAPI schema is
called with realistic data: a registered, approved runner with a stored
result, a kernel submission, and rows holding non-finite floats written
straight to the database, as no ingest would store them now."""

from __future__ import annotations

import json
import math
from datetime import timedelta

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.contrib.auth.models import Group

from matrix.accounts.roles import KERNEL_AUTHOR
from matrix.fleet import services
from matrix.models import Cell, Result, Shape
from matrix.submissions import kernel_submit
from runners import signing
from tests.runners.conftest import RunnerHand, cpu_inventory
from tests.security.helpers import attack_source


def strict(text: str):
    def refuse(name):
        raise AssertionError(f"{name} in an API answer: not JSON")

    return json.loads(text, parse_constant=refuse)


@pytest.fixture
def world(catalog, admin_user, django_user_model):
    """A runner with a claimed job and a stored result, a submission, and a
    cell and result holding non-finite numbers."""
    key = Ed25519PrivateKey.generate()
    runner = services.runner_register(
        token=services.token_create(expires=timedelta(hours=1)),
        name="cpu-1",
        public_key=signing.public_key_hex(key),
        inventory=cpu_inventory(),
    )
    runner = services.runner_approve(name="cpu-1")
    hand = RunnerHand(runner, key)
    services.runner_heartbeat(envelope=hand.heartbeat())
    from matrix.models import DeviceType, Toolchain

    cpu = DeviceType.objects.get(backend="c")
    toolchain = Toolchain.objects.get(name="tilelang-0.1.15-cpu")
    shapes = list(Shape.objects.filter(source_profile="cpu-smoke").order_by("pk"))
    sweep = services.sweep_plan(cells=[(s, cpu, toolchain) for s in shapes[:3]])
    done, running, waiting = sweep.jobs.order_by("pk")
    for job in (done, running):
        assert services.job_claim(job_id=job.pk, attempt=1, runner=runner)
    services.result_ingest(
        envelope=hand.result(
            done,
            metrics={"rel_err": 0.0, "max_abs_err": 0.0, "mismatch_ratio": 0.0},
            timings={"compile_s": 0.5, "kernel_ms": 0.2, "reference_ms": 0.4},
        )
    )
    # What no ingest stores any more, but a database may still hold.
    Cell.objects.filter(shape=done.shape).update(
        kernel_ms=math.inf, reference_ms=-math.inf
    )
    Result.objects.filter(job=done).update(rel_err=math.inf, kernel_ms=math.inf)
    toolchain.is_current = True
    toolchain.save(update_fields=["is_current"])
    author = django_user_model.objects.create_user("author", password="x")
    author.groups.add(Group.objects.get(name=KERNEL_AUTHOR))
    submission = kernel_submit(
        operator=shapes[0].operator,
        source=attack_source("good_add").replace("good_add", "matrix_add"),
        author=author,
        backends=["c"],
    )
    return {
        "hand": hand,
        "running": running,
        "done": done,
        "waiting": waiting,
        "submission": submission,
        "toolchain": toolchain,
    }


def _requests(world) -> dict:
    """operationId -> (method, path, JSON body or None): realistic calls."""
    hand, running = world["hand"], world["running"]
    key = {"job": running.pk, "attempt": running.attempt}
    pk = world["submission"].pk
    return {
        "matrix_api_health": ("GET", "/health", None),
        "runners_api_register": (
            "POST",
            "/runners/register",
            {
                "token": services.token_create(expires=timedelta(hours=1)),
                "name": "cpu-2",
                "public_key": signing.public_key_hex(Ed25519PrivateKey.generate()),
                "inventory": cpu_inventory(),
            },
        ),
        "runners_api_heartbeat": ("POST", "/runners/heartbeat", hand.heartbeat()),
        "runners_api_jobs_claim": (
            "POST",
            "/runners/claim",
            hand.request("claim", jobs=[{"job": world["waiting"].pk, "attempt": 1}]),
        ),
        "runners_api_runner_recover": (
            "POST",
            "/runners/recover",
            hand.request("recover", restarted=False),
        ),
        "runners_api_outbox_pending": (
            "POST",
            "/runners/outbox",
            hand.request("outbox", jobs=[key]),
        ),
        "runners_api_runner_queues": (
            "POST",
            "/runners/queues",
            hand.request("queues"),
        ),
        "runners_api_results_upload": (
            "POST",
            "/results",
            {
                "results": [
                    hand.result(running, "pass", timings={"kernel_ms": math.inf}),
                    hand.result(running, "compile_error"),
                ]
            },
        ),
        "matrix_api_manifest_manifest": ("GET", "/manifest", None),
        "matrix_api_submissions_kernel_create": (
            "POST",
            "/kernels",
            {"operator": "elementwise_add", "source": "import os", "backends": ["c"]},
        ),
        "matrix_api_submissions_kernel_read": ("GET", f"/kernels/{pk}", None),
        "matrix_api_submissions_kernel_review": (
            "POST",
            f"/kernels/{pk}/review",
            {"decision": "approve"},
        ),
        "matrix_api_submissions_kernel_revert": (
            "POST",
            f"/kernels/{pk}/revert",
            {"backends": ["c"], "comment": "back to the library"},
        ),
        "matrix_api_coverage_coverage_matrix": ("GET", "/matrix?backend=c", None),
        "matrix_api_coverage_coverage_gaps": ("GET", "/gaps", None),
        "matrix_api_coverage_coverage_models": ("GET", "/models", None),
        "matrix_api_alerts_alerts_list": ("GET", "/alerts", None),
        # No bisection here: its 404 must be strict JSON too.
        "matrix_api_bisections_bisection_read": ("GET", "/bisections/999999", None),
    }


def test_every_api_operation_answers_strict_json(client, world, admin_user):
    client.force_login(admin_user)
    schema = strict(client.get("/api/v1/openapi.json").content.decode())
    operations = {
        op["operationId"]: (method.upper(), path)
        for path, ops in schema["paths"].items()
        for method, op in ops.items()
    }
    requests = _requests(world)
    assert set(requests) == set(operations), "give every operation a request here"

    answers = {}
    for operation, (method, path, body) in requests.items():
        assert operations[operation][0] == method
        url = f"/api/v1{path}"
        if method == "GET":
            response = client.get(url)
        else:
            response = client.post(
                url, data=json.dumps(body), content_type="application/json"
            )
        assert response.status_code < 500, (operation, response.content[:300])
        assert response["Content-Type"].startswith("application/json"), operation
        answers[operation] = (response.status_code, strict(response.content.decode()))

    # The stored infinities were there to be answered, and are null.
    status, matrix = answers["matrix_api_coverage_coverage_matrix"]
    assert status == 200
    done = world["done"]
    [cell] = [
        c
        for c in matrix["cells"]
        if (c["operator"], c["dims"], c["dtype"], c["device_type"])
        == (
            done.shape.operator.name,
            done.shape.dims,
            done.shape.dtype,
            str(done.device_type),
        )
    ]
    assert (cell["status"], cell["kernel_ms"], cell["reference_ms"]) == (
        "pass",
        None,
        None,
    )
    # The forged Infinity in an upload is refused for good: it ends the job's
    # attempt, so the second result for that attempt changes nothing.
    status, upload = answers["runners_api_results_upload"]
    assert (status, upload["stored"], upload["duplicate"]) == (200, 0, 1)
    assert upload["refused"][0]["reason"].startswith("result.timings.kernel_ms")
