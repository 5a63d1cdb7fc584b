"""Signing in: Django's model backend, with the role check read alongside."""

from __future__ import annotations

from functools import cache

from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend
from django.core.exceptions import ValidationError
from django.db import connection
from django.db.models import BooleanField
from django.db.models.expressions import RawSQL

from runners.roles import ROLES


def _holds_grant() -> RawSQL:
    """Whether the account is in a role's group or holds a permission
    granted directly (``roles.granted()``), as SQL over the through tables:
    the ORM's form of it joined the user table again and cost a page view
    about a millisecond more to plan."""
    users = get_user_model()
    groups = users.groups.through._meta.db_table
    grants = users.user_permissions.through._meta.db_table
    group = users.groups.field.related_model._meta.db_table
    user = users._meta.db_table
    names = ", ".join(["%s"] * len(ROLES))
    return RawSQL(
        f"EXISTS (SELECT 1 FROM {groups} ug JOIN {group} g ON g.id = ug.group_id"
        f" WHERE ug.user_id = {user}.id AND g.name IN ({names}))"
        f" OR EXISTS (SELECT 1 FROM {grants} up WHERE up.user_id = {user}.id)",
        list(ROLES),
        output_field=BooleanField(),
    )


class RoleModelBackend(ModelBackend):
    """Django's ``ModelBackend``, except that the signed-in user's row comes
    with whether the account holds any role or grant, which RoleMiddleware
    asks on every request: one query per request where there were two."""

    def get_user(self, user_id):
        model = get_user_model()
        try:
            pk = model._meta.pk.to_python(user_id)
        except ValidationError:
            return None
        sql, compiled, at = _user_query(connection.vendor)
        params = list(compiled)
        params[at] = pk
        # raw(): the driver's values converted as the ORM converts them.
        user = next(iter(model._default_manager.raw(sql, params)), None)
        if user is None or not self.user_can_authenticate(user):
            return None
        user._tilematrix_granted = bool(user.holds_grant)
        return user


# Where the user's id goes in the compiled query.
_PK_MARK = -7_352_019


@cache
def _user_query(vendor: str) -> tuple[str, tuple, int]:
    """The signed-in user's query, compiled once per process (the ORM took
    about a millisecond of every page view to build it): its SQL, its
    parameters and where the user's id goes among them."""
    users = get_user_model()._default_manager
    query = (
        users.annotate(holds_grant=_holds_grant()).filter(pk=_PK_MARK).order_by()[:1]
    )
    sql, params = query.query.get_compiler(connection.alias).as_sql()
    return sql, tuple(params), list(params).index(_PK_MARK)
