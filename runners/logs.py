"""Log lines an operator can follow: one JSON object a line with
``TILEMATRIX_LOG_FORMAT=json``, each carrying the request id of the web
request it belongs to and, in a Celery worker, the task id.

The request id travels with the work a request starts: it is put in the
headers of every Celery message sent while it is current (planning a sweep
sends the job messages, a runner's job sends its result messages), and a
worker makes it current while it runs such a message. So the id of the
request that pressed "Run missing" is on the runner's lines for those
jobs and on the control worker's lines storing their results. A line
that knows its job or sweep says so with ``extra={"job_id": ...}``.

The server's settings and the runner agent's app both load it (the same
variable, read alike on both sides): nothing here may import Django."""

from __future__ import annotations

import json
import logging
import os
import re
import uuid
from contextvars import ContextVar
from datetime import UTC, datetime

from celery.signals import (
    after_setup_logger,
    after_setup_task_logger,
    before_task_publish,
    task_postrun,
    task_prerun,
)

from runners import config

FORMATS = ("text", "json")
HEADER = "request_id"
# An id a caller sends is kept when it is a plain token (a proxy's or a
# load balancer's); anything else could forge log lines, and is replaced.
ID_FORMAT = re.compile(r"[A-Za-z0-9._:-]{1,128}")

request_id: ContextVar[str | None] = ContextVar("request_id", default=None)

# The attributes every LogRecord has: anything else came with ``extra=``.
_RECORD_FIELDS = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
}
_PLAIN = (str, int, float, bool, type(None), list, dict)


def log_format(raw: str | None) -> str:
    value = (raw or "text").strip().lower()
    if value not in FORMATS:
        raise config.SettingError(
            f"TILEMATRIX_LOG_FORMAT: expected text or json, got {raw!r}"
        )
    return value


def request_id_from(header: str | None) -> str:
    """The caller's X-Request-ID where it is a plain token, else a new id."""
    if header and ID_FORMAT.fullmatch(header):
        return header
    return uuid.uuid4().hex


def _current_task_id() -> str | None:
    from celery import current_task

    task = current_task
    if not task or task.request.called_directly:
        return None
    return task.request.id


# A line longer than this is cut: a message quoting what a sender sent (a
# refused payload, a task's arguments) must not write hundreds of megabytes.
LINE_MAX = 8192


class ContextFilter(logging.Filter):
    """Puts the current request id and Celery task id on every record (the
    text format ignores them; the JSON one writes them), and cuts a message
    longer than LINE_MAX."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if len(message) > LINE_MAX:
            record.msg = f"{message[:LINE_MAX]}... ({len(message)} characters, cut)"
            record.args = None
        if getattr(record, "request_id", None) is None:
            # Django logs a 4xx or 5xx answer after the middleware is left,
            # with the request beside the record.
            request = getattr(record, "request", None)
            record.request_id = getattr(request, "request_id", None) or request_id.get()
        if getattr(record, "task_id", None) is None:
            record.task_id = _current_task_id()
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time (UTC), level, logger, message, the ids
    the ContextFilter added, whatever came with ``extra=`` that JSON can
    hold, and the traceback of an exception."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _RECORD_FIELDS and value is not None:
                if isinstance(value, _PLAIN):
                    entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exception"] = record.exc_text
        return json.dumps(entry, default=str)


def _json_logging() -> bool:
    return log_format(os.environ.get("TILEMATRIX_LOG_FORMAT")) == "json"


@after_setup_logger.connect
@after_setup_task_logger.connect
def celery_handlers_in_json(logger=None, **_) -> None:
    """A Celery worker sets up its own handlers over Django's LOGGING: they
    cut long lines too, and write JSON when asked."""
    if logger is None:
        return
    for handler in logger.handlers:
        handler.addFilter(ContextFilter())
        if _json_logging():
            handler.setFormatter(JsonFormatter())


@before_task_publish.connect
def request_id_sent(headers=None, **_) -> None:
    current = request_id.get()
    if headers is not None and current and HEADER not in headers:
        headers[HEADER] = current


_tokens: dict[str, object] = {}


@task_prerun.connect
def request_id_received(task_id=None, task=None, **_) -> None:
    # A worker's message has it among the request's own fields; a task run
    # with apply(headers=...) keeps it under ``headers``.
    request = getattr(task, "request", None)
    sent = getattr(request, HEADER, None) or (
        getattr(request, "headers", None) or {}
    ).get(HEADER)
    if sent and task_id:
        _tokens[task_id] = request_id.set(request_id_from(sent))


@task_postrun.connect
def request_id_ended(task_id=None, **_) -> None:
    token = _tokens.pop(task_id, None)
    if token is not None:
        request_id.reset(token)
