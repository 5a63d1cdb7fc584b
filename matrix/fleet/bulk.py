"""Many rows at once on PostgreSQL, for the ingest path.

Inserting: one ``INSERT ... SELECT FROM unnest(column arrays)`` statement,
the arrays sent in binary over a server-side-binding cursor. Django's
``bulk_create`` prepares every value of every row in Python, and its
client-side binding has psycopg write each array out as quoted text, one
element at a time: both cost more than the database's own work.

Matching: ``field__any=values`` is ``IN (...)`` elsewhere but ``= ANY(%s)``
on PostgreSQL, one array parameter in place of a placeholder per value,
which psycopg would otherwise parse and quote one by one. Pass a set (or
any iterable but a list or tuple), which Django does not walk value by value
looking for expressions.

Other databases fall back to Django's own ways."""

from __future__ import annotations

import json

from django.core.exceptions import EmptyResultSet
from django.db import connection, models
from django.db.models.lookups import In


@models.Field.register_lookup
class AnyOf(In):
    lookup_name = "any"

    def as_postgresql(self, compiler, connection):
        if not self.rhs_is_direct_value():
            return super().as_sql(compiler, connection)
        lhs, params = self.process_lhs(compiler, connection)
        field = self.lhs.output_field
        values = [
            field.get_db_prep_value(v, connection, prepared=True)
            for v in self.rhs
            if v is not None
        ]
        if not values:
            raise EmptyResultSet
        return f"{lhs} = ANY(%s::{field.db_type(connection)}[])", [*params, values]


def columns_insert(
    model: type[models.Model],
    columns: dict[str, list],
    *,
    unique: list[str] | None = None,
    update: list[str] | None = None,
) -> list[int]:
    """Insert rows given column by column (field name -> values, relations
    by id, JSON fields as Python objects) and return their primary keys. With
    ``unique``, a conflicting row gets ``update``'s fields (or is left as it
    is) and nothing is returned."""
    count = len(next(iter(columns.values()), []))
    if not count:
        return []
    fields = {name: model._meta.get_field(name) for name in columns}
    if connection.vendor != "postgresql":
        objs = [
            model(**{fields[n].attname: v[i] for n, v in columns.items()})
            for i in range(count)
        ]
        options = {}
        if unique:
            options = (
                {
                    "update_conflicts": True,
                    "unique_fields": unique,
                    "update_fields": update,
                }
                if update
                else {"ignore_conflicts": True}
            )
        model.objects.bulk_create(objs, **options)
        return [] if unique else [o.pk for o in objs]
    names, selects, arrays, params = [], [], [], []
    for name, values in columns.items():
        field = fields[name]
        names.append(field.column)
        if isinstance(field, models.JSONField):
            values = [None if v is None else json.dumps(v) for v in values]
            arrays.append("%b::text[]")
            selects.append(f"{field.column}::jsonb")
        else:
            arrays.append(f"%b::{field.db_type(connection)}[]")
            selects.append(field.column)
        params.append(values)
    sql = (
        f"INSERT INTO {model._meta.db_table} ({', '.join(names)}) "
        f"SELECT {', '.join(selects)} FROM unnest({', '.join(arrays)}) "
        f"AS u({', '.join(names)})"
    )
    if unique:
        targets = ", ".join(model._meta.get_field(f).column for f in unique)
        if update:
            sets = ", ".join(
                f"{c} = EXCLUDED.{c}"
                for c in (model._meta.get_field(f).column for f in update)
            )
            sql += f" ON CONFLICT ({targets}) DO UPDATE SET {sets}"
        else:
            sql += f" ON CONFLICT ({targets}) DO NOTHING"
    else:
        sql += f" RETURNING {model._meta.pk.column}"
    # Imported here: GPU runner hosts load this module with Django but have no
    # database driver (requirements-gpu.txt), and never reach this line.
    import psycopg

    connection.ensure_connection()
    # Outside Django's cursor wrapper, so its error translation is applied
    # here: callers (and Celery's retries) see django.db errors as usual.
    with connection.wrap_database_errors:
        with psycopg.Cursor(connection.connection) as cursor:
            cursor.execute(sql, params)
            return [] if unique else [row[0] for row in cursor.fetchall()]


def rows_insert(
    model: type[models.Model], objs: list[models.Model], *, fields: list[str]
) -> None:
    """Insert new model instances and set their primary keys. Their values
    go in as they are (no ``get_prep_value``): the callers build them."""
    if not objs:
        return
    if connection.vendor != "postgresql":
        model.objects.bulk_create(objs)
        return
    attnames = {name: model._meta.get_field(name).attname for name in fields}
    ids = columns_insert(
        model,
        {
            name: [getattr(o, attname) for o in objs]
            for name, attname in attnames.items()
        },
    )
    for obj, pk in zip(objs, ids, strict=True):
        obj.pk = pk
        obj._state.adding = False
