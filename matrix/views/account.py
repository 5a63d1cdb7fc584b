"""Logging out: Django logs out on POST only (a link must not end a
session), so a typed or bookmarked /logout/ gets a page with the button
instead of a blank 405."""

from __future__ import annotations

from django.contrib.auth import views as auth_views
from django.template.response import TemplateResponse


class LogoutView(auth_views.LogoutView):
    http_method_names = ["get", "post", "options"]

    def get(self, request, *args, **kwargs):
        return TemplateResponse(request, "registration/logout_confirm.html")
