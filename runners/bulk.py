"""Inserting many rows at once on PostgreSQL: one ``INSERT ... SELECT FROM
unnest(column arrays)`` statement. Django's ``bulk_create`` prepares every
value of every row in Python, which cost more than the database itself in
the ingest and sweep paths. Other databases fall back to ``bulk_create``."""

from __future__ import annotations

import json

from django.db import connection, models


def rows_insert(
    model: type[models.Model],
    objs: list[models.Model],
    *,
    fields: list[str],
    unique: list[str] | None = None,
    update: list[str] | None = None,
) -> None:
    """Insert ``objs`` and set their primary keys. With ``unique``, a
    conflicting row gets ``update``'s fields (or is left as it is)."""
    if not objs:
        return
    if connection.vendor != "postgresql":
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
        return
    columns = [model._meta.get_field(name) for name in fields]
    names = [c.column for c in columns]
    selects, arrays, params = [], [], []
    for column in columns:
        kind = column.db_type(connection)
        values = [column.get_prep_value(getattr(o, column.attname)) for o in objs]
        if isinstance(column, models.JSONField):
            values = [None if v is None else json.dumps(v) for v in values]
            arrays.append("%s::text[]")
            selects.append(f"{column.column}::jsonb")
        else:
            arrays.append(f"%s::{kind}[]")
            selects.append(column.column)
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
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
        return
    with connection.cursor() as cursor:
        cursor.execute(sql + f" RETURNING {model._meta.pk.column}", params)
        ids = [row[0] for row in cursor.fetchall()]
    for obj, pk in zip(objs, ids, strict=True):
        obj.pk = pk
        obj._state.adding = False
