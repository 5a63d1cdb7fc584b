"""Signing in: Django's model backend, with the role check read alongside."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend
from django.core.exceptions import ValidationError
from django.db import connection
from django.db.models import BooleanField
from django.db.models.expressions import RawSQL

from matrix.accounts.roles import ROLES


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
        query = _user_query(connection.vendor)
        params = list(query.params)
        params[query.pk_at] = pk
        with connection.cursor() as cursor:
            cursor.execute(query.sql, params)
            row = cursor.fetchone()
        if row is None:
            return None
        # The driver's values converted as the ORM converts them (SQLite's
        # dates are text), without a RawQuerySet: it resolved the columns
        # against the model again on every page view.
        values = list(row)
        for at, (converters, expression) in query.converters:
            for convert in converters:
                values[at] = convert(values[at], expression, connection)
        *fields, granted = values
        user = model.from_db(connection.alias, query.names, fields)
        if not self.user_can_authenticate(user):
            return None
        user._tilematrix_granted = bool(granted)
        return user


# Where the user's id goes in the compiled query.
_PK_MARK = -7_352_019


@dataclass(frozen=True)
class _UserQuery:
    sql: str
    params: tuple
    pk_at: int  # where the user's id goes among the parameters
    names: list[str]  # the model's fields, in the order the row holds them
    converters: (
        list  # (column, (converters, expression)), as the ORM's compiler has them
    )


@cache
def _user_query(vendor: str) -> _UserQuery:
    """The signed-in user's query, compiled once per process (the ORM took
    about a millisecond of every page view to build it): its SQL, its
    parameters, where the user's id goes, the model's fields in the row's
    order (the grant last) and the converters of its columns."""
    users = get_user_model()._default_manager
    query = (
        users.annotate(holds_grant=_holds_grant()).filter(pk=_PK_MARK).order_by()[:1]
    )
    compiler = query.query.get_compiler(connection.alias)
    sql, params = compiler.as_sql()
    columns = [expression for expression, _, _ in compiler.select]
    names = [column.target.attname for column in columns[:-1]]
    return _UserQuery(
        sql=sql,
        params=tuple(params),
        pk_at=list(params).index(_PK_MARK),
        names=names,
        converters=list(compiler.get_converters(columns).items()),
    )
