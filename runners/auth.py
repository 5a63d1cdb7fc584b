"""Signing in: Django's model backend, with the role check read alongside."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend
from django.db.models import Exists, OuterRef

from runners.roles import granted


class RoleModelBackend(ModelBackend):
    """Django's ``ModelBackend``, except that the signed-in user's row comes
    with whether the account holds any role or grant, which RoleMiddleware
    asks on every request: one query per request where there were two."""

    def get_user(self, user_id):
        users = get_user_model()._default_manager
        holds = users.filter(pk=OuterRef("pk")).filter(granted())
        user = users.annotate(holds_grant=Exists(holds)).filter(pk=user_id).first()
        if user is None or not self.user_can_authenticate(user):
            return None
        user._tilematrix_granted = user.holds_grant
        return user
