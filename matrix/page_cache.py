"""Whole reader pages, kept once per data version for every signed-in reader.

A reader page (the matrix, a cell, the error groups, the gaps for a reader
who cannot run sweeps) is the same for every signed-in reader of the same
address until its data changes, except for the page's frame: the reader's
name, their CSRF token and whether the navigation offers the admin site. The
page is rendered once with stand-ins for the name and the token (once per
admin-link choice), kept under a key that names its data version and the
values its filter form offers (kept a few seconds for every page), and each
view puts in the reader's own name and token: a view served from the cache
runs no template. While one reader renders a page for a new data version,
the others are given the page of the version before (``answer_read``). Under 50 readers at once, rendering the frame and the
filter form was most of what a cached page still cost.

A view with messages to show (a notice after a form) is rendered as usual,
as is every page for a visitor who is not signed in."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from functools import cache as once

from django.conf import settings
from django.contrib.messages import get_messages
from django.http import HttpResponse
from django.middleware.csrf import get_token
from django.utils.html import escape

from matrix.cache import answer_read, cache_seconds, derived_key
from matrix.context_processors import FilterChoices, admin_link_of


@once
def _slots() -> tuple[str, str]:
    """Stand-ins for the reader's name and CSRF token: letters and digits
    (unchanged by escaping), from the secret key, so that no text a page
    shows (a kernel source, an error message) can hold one by chance or by
    design."""
    digest = hashlib.sha256(
        ("tilematrix-page-slots:" + settings.SECRET_KEY).encode()
    ).hexdigest()
    return f"readername{digest[:32]}", f"csrftoken{digest[32:]}"


class _AnyReader:
    """The signed-in reader as a kept page's frame shows them."""

    is_authenticated = True
    is_anonymous = False

    def get_username(self) -> str:
        return _slots()[0]


def page_response(
    request, key: str | None, render: Callable[[dict], str]
) -> HttpResponse:
    """The page ``render(frame)`` renders (``frame`` merged into its
    context), kept under ``key`` (None: never kept) for signed-in readers."""
    if (
        key is None
        or not cache_seconds()
        or not request.user.is_authenticated
        or len(get_messages(request))
    ):
        return HttpResponse(render({}))
    admin_link = admin_link_of(request.user)
    name, token = _slots()
    frame = {"user": _AnyReader(), "csrf_token": token, "admin_link": admin_link}
    choices = FilterChoices().digest
    # Kept as UTF-8: a page with one character outside Latin-1 is two
    # bytes a character as text, encoded again on every view.
    _, html = answer_read(
        derived_key(key, "page", int(admin_link), choices, "utf-8"),
        lambda: render(frame).encode(),
        cache_seconds(),
    )
    html = html.replace(name.encode(), escape(request.user.get_username()).encode())
    return HttpResponse(html.replace(token.encode(), get_token(request).encode()))
