"""Control characters in a request's parameters are refused, in words,
before any view reads them.

No page or filter takes one: a NUL cannot even be stored in PostgreSQL's
text (psycopg refuses it, and nine pages answered 500 for a NUL in ``q`` or
``model``), and an escape sequence in a name would reach a terminal or a
spreadsheet. Query parameters may hold none (names and values alike); a
form may hold tabs and line breaks, which text areas send, and no other.
Pages answer 400 with the 400 page's reason; the API answers 422, the
refusal its schema declares for input out of range.
"""

from __future__ import annotations

import re

from django.http import JsonResponse
from django.shortcuts import render

from matrix.api_errors import API_PREFIX

IN_QUERIES = re.compile(r"[\x00-\x1f\x7f]")
IN_FORMS = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")


def _first_control(pairs, pattern: re.Pattern) -> tuple[str, str] | None:
    """(parameter name, the character as U+XXXX) of the first control
    character in ``pairs`` of (name, values), or None."""
    for name, values in pairs:
        for text in (name, *values):
            found = pattern.search(text)
            if found:
                return name, f"U+{ord(found.group()):04X}"
    return None


class ControlCharacterMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        where = "a query parameter"
        found = _first_control(request.GET.lists(), IN_QUERIES)
        if found is None and request.method == "POST":
            where, found = "a form field", self._in_form(request)
        if found is None:
            return self.get_response(request)
        name, char = found
        reason = (
            f"{where} ({name[:40]!r}) holds a control character ({char}), which "
            "no field of this site takes: remove it and send it again. Nothing "
            "was changed."
        )
        if request.path_info.startswith(API_PREFIX):
            return JsonResponse({"detail": reason, "errors": []}, status=422)
        return render(request, "400.html", {"reason": reason}, status=400)

    @staticmethod
    def _in_form(request) -> tuple[str, str] | None:
        if request.path_info.startswith(API_PREFIX):
            return None  # JSON bodies: the API's own schemas check them
        if request.content_type not in FORM_TYPES:
            return None
        # A malformed multipart body raises here, and Django's own handler
        # answers it with a 400, as it would in the view.
        return _first_control(request.POST.lists(), IN_FORMS)
