"""An htmx request whose session has ended goes to the login page as a whole
page. Left alone, the browser follows the login redirect inside the request
and htmx pastes the login form into whatever element it was about to
replace: a table row, the token slot."""

from __future__ import annotations

from urllib.parse import urlsplit

from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.shortcuts import resolve_url
from django_htmx.http import HttpResponseClientRedirect


class HtmxLoginRedirectMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        if not request.htmx or response.status_code != 302:
            return response
        login_path = urlsplit(resolve_url(settings.LOGIN_URL)).path
        if urlsplit(response["Location"]).path != login_path:
            return response
        # Back to the page the user was on, not to the fragment it asked for.
        here = request.htmx.current_url_abs_path or resolve_url("matrix")
        return HttpResponseClientRedirect(redirect_to_login(here).url)
