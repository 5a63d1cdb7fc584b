"""Errors under /api/ answer in JSON, as every endpoint there does. Django
answers a path no route matches, and a route's wrong method, before the
API sees the request: left alone, a client parsing ``{"detail": ...}``
would get the site's HTML 404 page or a bare "Method not allowed"."""

from __future__ import annotations

from django.http import JsonResponse
from django.urls import reverse

API_PREFIX = "/api/"


def _detail(request, response) -> str:
    where = f"{request.method} {request.path}"
    if response.status_code == 404:
        schema = reverse("api:openapi-json")
        return f"no API endpoint answers {where}; {schema} lists them"
    if response.status_code == 405:
        allowed = response.get("Allow", "")
        return f"{where} is not allowed; this path takes {allowed or 'no method'}"
    return "server error"


class ApiJsonErrorsMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        if (
            not request.path_info.startswith(API_PREFIX)
            or response.status_code not in (404, 405, 500)
            or response.get("Content-Type", "").startswith("application/json")
        ):
            return response
        json_response = JsonResponse(
            {"detail": _detail(request, response)}, status=response.status_code
        )
        if "Allow" in response:
            json_response["Allow"] = response["Allow"]
        return json_response
