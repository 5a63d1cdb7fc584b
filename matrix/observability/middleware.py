"""The request id, and the operator's endpoints answered before the rest.

Both run first in MIDDLEWARE. The probes and /metrics are answered here,
ahead of the host check (ALLOWED_HOSTS), the HTTPS redirect and the role
check: an orchestrator and Prometheus address each process by its own IP
over plain HTTP, and need no account."""

from __future__ import annotations

from matrix.observability import metrics, probes
from runners import logs


class RequestIdMiddleware:
    """Makes the request's id current (the caller's X-Request-ID, or a new
    one) and echoes it in the response."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        request.request_id = logs.request_id_from(request.headers.get("X-Request-ID"))
        token = logs.request_id.set(request.request_id)
        try:
            response = self.get_response(request)
        finally:
            logs.request_id.reset(token)
        response["X-Request-ID"] = request.request_id
        return response


ENDPOINTS = {
    "/livez": probes.livez,
    "/readyz": probes.readyz,
    "/metrics": metrics.metrics_response,
}


class OperatorEndpointsMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        answer = ENDPOINTS.get(request.path_info)
        if answer is None:
            return self.get_response(request)
        return answer(request)
