"""Errors under /api/ answer in JSON, as every endpoint there does. Django
answers a path no route matches, and a route's wrong method, before the
API sees the request: left alone, a client parsing ``{"detail": ...}``
would get the site's HTML 404 page or a bare "Method not allowed"."""

from __future__ import annotations

from django.http import JsonResponse
from django.urls import reverse
from ninja import Schema

API_PREFIX = "/api/"


class Problem(Schema):
    """A refusal: a sentence saying why (every error of this API has one)."""

    detail: str


class InputProblem(Schema):
    """Input of the wrong type or out of range: ``detail`` names each field,
    ``errors`` is the validator's own list."""

    detail: str
    errors: list[dict]


class TooBig(Schema):
    """A body over the most this server reads at once."""

    detail: str
    limit_bytes: int


# What any operation may answer, whatever it declares itself: refused input
# (given any input), and a body too big to read (given a body).
_REFUSALS = (
    ("422", InputProblem, "the input has the wrong type or is out of range"),
    ("413", TooBig, "the body is over the limit: send less at once"),
)


def refusals_declare(schema: dict) -> dict:
    """The OpenAPI schema with the refusals every operation can give declared
    on each, so a client generated from it, or a check of the answers
    against it, knows them."""
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for code, model, description in _REFUSALS:
        components[model.__name__] = model.model_json_schema(
            ref_template="#/components/schemas/{model}"
        )
        ref = {"$ref": f"#/components/schemas/{model.__name__}"}
        for operations in schema.get("paths", {}).values():
            for operation in operations.values():
                takes = operation.get("requestBody") or (
                    code == "422" and operation.get("parameters")
                )
                if takes:
                    operation.setdefault("responses", {}).setdefault(
                        code,
                        {
                            "description": description,
                            "content": {"application/json": {"schema": ref}},
                        },
                    )
    return schema


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
