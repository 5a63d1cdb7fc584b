"""JSON log lines carry the request id, which each response echoes and
Celery messages carry on to the worker."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from celery import shared_task

from matrix.observability.queues import broker_connection
from runners import logs

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def json_lines():
    """What the root logger writes, as the JSON handler writes it."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logs.JsonFormatter())
    handler.addFilter(logs.ContextFilter())
    root = logging.getLogger()
    root.addHandler(handler)
    yield lambda: [json.loads(line) for line in stream.getvalue().splitlines()]
    root.removeHandler(handler)


def test_a_requests_log_line_carries_the_id_the_caller_sent(client, db, json_lines):
    response = client.get("/no-such-page/", HTTP_X_REQUEST_ID="lb-7f3a.42")
    assert response.status_code == 404
    assert response["X-Request-ID"] == "lb-7f3a.42"
    (line,) = [e for e in json_lines() if e["logger"] == "django.request"]
    assert line["request_id"] == "lb-7f3a.42"
    assert line["level"] == "WARNING" and line["message"] == "Not Found: /no-such-page/"
    assert line["status_code"] == 404 and line["time"].endswith("+00:00")


def test_a_request_without_an_id_or_with_a_forged_one_gets_a_new_one(
    client, db, json_lines
):
    plain = client.get("/no-such-page/")
    forged = client.get("/no-such-page/", HTTP_X_REQUEST_ID='x"\n{"level": "INFO"}')
    given = [plain["X-Request-ID"], forged["X-Request-ID"]]
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in given)
    assert given[0] != given[1]
    assert [e["request_id"] for e in json_lines()] == given


def test_a_line_says_the_job_it_is_about_with_extra(json_lines):
    logging.getLogger("matrix.planning").info(
        "planned %d jobs", 3, extra={"job_id": 17, "sweep_id": 4}
    )
    (line,) = json_lines()
    assert line["message"] == "planned 3 jobs"
    assert (line["job_id"], line["sweep_id"]) == (17, 4)
    assert "request_id" not in line  # none is current outside a request


def test_an_exception_is_one_line_with_its_traceback(json_lines):
    try:
        raise ValueError("bad input")
    except ValueError:
        logging.getLogger("matrix").exception("it failed")
    (line,) = json_lines()
    assert "ValueError: bad input" in line["exception"]


@shared_task(name="tests.observability.logged")
def logged():
    logging.getLogger("tests.observability").warning("in the task")


def test_a_task_logs_the_request_id_its_message_carries(json_lines):
    logged.apply(headers={"request_id": "req-from-web"}, task_id="task-1")
    (line,) = [e for e in json_lines() if e["message"] == "in the task"]
    assert (line["request_id"], line["task_id"]) == ("req-from-web", "task-1")
    assert logs.request_id.get() is None  # ended with the task


def test_a_message_sent_during_a_request_carries_its_id(settings, tmp_path):
    from matrix.celery import app

    queue = "obs-request-id"
    token = logs.request_id.set("req-123")
    try:
        app.send_task("tests.observability.logged", queue=queue)
    finally:
        logs.request_id.reset(token)
    with broker_connection(2) as conn:
        waiting = conn.SimpleQueue(queue)
        try:
            message = waiting.get(timeout=5)
            message.ack()
        finally:
            waiting.close()
    assert message.headers["request_id"] == "req-123"


def run_with(log_format: str) -> subprocess.CompletedProcess:
    code = (
        "import django, logging; django.setup(); "
        "logging.getLogger('matrix').warning('ready', extra={'job_id': 5})"
    )
    env = {**os.environ, "TILEMATRIX_LOG_FORMAT": log_format}
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**env, "DJANGO_SETTINGS_MODULE": "matrix.settings"},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_setting_turns_every_line_into_json():
    done = run_with("json")
    assert done.returncode == 0, done.stderr
    (line,) = [json.loads(text) for text in done.stderr.splitlines()]
    assert (line["message"], line["job_id"], line["logger"]) == ("ready", 5, "matrix")


def test_a_format_it_does_not_know_stops_the_process_naming_the_setting():
    done = run_with("xml")
    assert done.returncode != 0
    assert "TILEMATRIX_LOG_FORMAT: expected text or json, got 'xml'" in done.stderr
