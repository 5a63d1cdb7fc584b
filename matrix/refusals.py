"""Refusals answered in words, without a traceback in the log.

A view refuses an action by raising PermissionDenied. Django's own handler
renders the 403 page but also logs the exception with its traceback at
warning level: for an expected answer (a viewer pressing Revoke, a proposer
approving their own upgrade) that buries real errors. The middleware here
answers with the same 403 page and leaves the log to Django's one-line
"Forbidden: /path" record.

``Refused`` is a refusal no role lifts (deciding on your own proposal): the
page says why, and does not suggest asking an admin for a role.
"""

from __future__ import annotations

from django.core.exceptions import PermissionDenied
from django.shortcuts import render


class Refused(PermissionDenied):
    """Not allowed whatever the user's role: the rule is about them."""


class RefusalMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        return self.get_response(request)

    def process_exception(self, request, exception):
        if not isinstance(exception, PermissionDenied):
            return None
        if request.path_info.startswith("/api/"):
            return None  # the API answers in JSON (ApiJsonErrorsMiddleware)
        return render(
            request,
            "403.html",
            {
                "exception": str(exception),
                "role_helps": not isinstance(exception, Refused),
            },
            status=403,
        )
