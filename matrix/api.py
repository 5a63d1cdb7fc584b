"""The HTTP API under /api/v1/ (django-ninja); schema at /api/v1/openapi.json."""

from __future__ import annotations

import math

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.db import DataError, connection
from django.http import Http404
from ninja import NinjaAPI, Schema, Status
from ninja.errors import ValidationError as InputError

from matrix.api_errors import refusals_declare
from matrix.api_json import StrictJSONRenderer


class TileMatrixApi(NinjaAPI):
    def get_openapi_schema(self, **kwargs):
        return refusals_declare(super().get_openapi_schema(**kwargs))

    def get_openapi_operation_id(self, operation) -> str:
        # Operation ids name the module a route lives in. The runner routes
        # keep the ids they had in runners/api.py before the server's side
        # moved to matrix/fleet: clients generated from the schema use them.
        operation_id = super().get_openapi_operation_id(operation)
        return operation_id.replace("matrix_fleet_api_", "runners_api_", 1)


api = TileMatrixApi(
    title="TileMatrix API",
    version="1",
    description="Runner registration, heartbeats, signed results, matrix and "
    "gap queries, manifest download.",
    urls_namespace="api",
    # The interactive docs page loads Swagger UI from a CDN: blocked by the
    # Content-Security-Policy and unusable offline. The schema stays.
    docs_url=None,
    renderer=StrictJSONRenderer(),
)


@api.exception_handler(DataError)
def text_with_nul(request, exc):
    """PostgreSQL cannot hold NUL characters in text, and psycopg refuses such
    a parameter before it is sent: that is the caller's bad input, not a
    server error. Any other DataError is still a bug and stays a 500."""
    if "NUL" not in str(exc):
        raise exc
    return api.create_response(
        request, {"detail": "text may not contain NUL characters"}, status=400
    )


def _where(loc) -> str:
    # ninja names a body field ("body", "body", "token"): once is enough.
    parts = [str(p) for i, p in enumerate(loc) if i == 0 or p != loc[i - 1]]
    if len(parts) < 2:
        return parts[0] if parts else "input"
    return f"{'.'.join(parts[1:])} ({parts[0]})"


@api.exception_handler(InputError)
def invalid_input(request, exc):
    """Input of the wrong type or out of range: 422, as ninja answers it,
    but ``detail`` is a sentence naming each field, as in every other
    refusal of this API; ninja's list stays in ``errors``."""
    detail = "; ".join(
        f"{_where(e.get('loc', ()))}: {e.get('msg')}" for e in exc.errors
    )
    return api.create_response(
        request, {"detail": detail, "errors": exc.errors}, status=422
    )


@api.exception_handler(Http404)
def not_found(request, exc):
    """The endpoint's own words ("no such submission"), where ninja would
    answer a bare "Not Found"."""
    return api.create_response(request, {"detail": str(exc) or "Not Found"}, status=404)


def _megabytes(size: int, *, round_up: bool) -> str:
    # Rounded away from the limit, so a body just over it never reads as
    # equal to it.
    tenths = size / 2**20 * 10
    return f"{(math.ceil(tenths) if round_up else math.floor(tenths)) / 10:.1f} MB"


@api.exception_handler(RequestDataTooBig)
def body_too_big(request, exc):
    """Django will not read a body over DATA_UPLOAD_MAX_MEMORY_SIZE. That is
    the caller sending too much at once, not a server error: a 413 saying
    the limit lets a client split its upload instead of retrying it."""
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    try:
        size = int(request.META.get("CONTENT_LENGTH"))
        body = f"the body is {_megabytes(size, round_up=True)}"
    except (TypeError, ValueError):
        body = "the body is too large"
    detail = (
        f"{body}; the most this server takes is "
        f"{_megabytes(limit, round_up=False)}: send less in one request "
        "(upload results in smaller batches)"
    )
    return api.create_response(
        request, {"detail": detail, "limit_bytes": limit}, status=413
    )


class Health(Schema):
    ok: bool
    database: str
    broker: str


def database_status() -> str:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        return "ok"
    except Exception as exc:
        return f"unreachable ({exc.__class__.__name__})"


def broker_status() -> str:
    from matrix.celery import app

    try:
        with app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, timeout=2)
        return "ok"
    except Exception as exc:
        return f"unreachable ({exc.__class__.__name__})"


api.add_router("/", "matrix.fleet.api.router")


@api.get("/health", response={200: Health, 503: Health}, auth=None)
def health(request):
    """Database and broker reachability; 503 when either is down."""
    body = {"database": database_status(), "broker": broker_status()}
    body["ok"] = body["database"] == "ok" and body["broker"] == "ok"
    return Status(200 if body["ok"] else 503, body)


# Routers of other modules register last so their imports see `api` defined.
from matrix.api_manifest import router as manifest_router  # noqa: E402

api.add_router("/", manifest_router)

from matrix.api_submissions import router as submissions_router  # noqa: E402

api.add_router("/", submissions_router)

from matrix.api_coverage import router as coverage_router  # noqa: E402

api.add_router("/", coverage_router)

from matrix.api_alerts import router as alerts_router  # noqa: E402

api.add_router("/", alerts_router)

from matrix.api_bisections import router as bisections_router  # noqa: E402

api.add_router("/", bisections_router)
