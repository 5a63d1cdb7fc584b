"""Move each result's kernel source (details["kernel_source"]) and error
message (the error_message column) into blobs, one row per SHA-256, and
drop details["kernel_source_sha256"]: the source's id says as much.

Chunk by chunk of result ids, each chunk committed on its own: a table of
millions of results is never locked whole, and a move cut short resumes
where it stopped (a moved result holds neither key nor message). On
PostgreSQL a chunk is two statements, hashing in the database; elsewhere the
rows pass through Python. Reversible the same way."""

import hashlib

from django.db import migrations, transaction
from django.db.models import Max, Min, Q

CHUNK = 10_000
# A source that is not a string (null: the harness built nothing) is dropped.
SOURCE = (
    "CASE WHEN jsonb_typeof(details -> 'kernel_source') = 'string' "
    "THEN details ->> 'kernel_source' END"
)
SHA256 = "encode(sha256(convert_to({}, 'UTF8')), 'hex')"
TO_MOVE = (
    "(details ? 'kernel_source' OR details ? 'kernel_source_sha256' "
    "OR error_message <> '')"
)


def chunks(Result, db):
    """(after, upto] id ranges over the results, CHUNK ids each, up to the
    newest result when each range is taken."""
    after = (Result.objects.using(db).aggregate(first=Min("id"))["first"] or 1) - 1
    while after < (Result.objects.using(db).aggregate(last=Max("id"))["last"] or 0):
        yield after, after + CHUNK
        after += CHUNK


def forward_sql(cursor, after, upto):
    cursor.execute(
        f"""
        INSERT INTO matrix_blob (sha256, text)
        SELECT {SHA256.format("t")}, t FROM (
            SELECT {SOURCE} FROM matrix_result WHERE id > %s AND id <= %s
            UNION SELECT error_message FROM matrix_result WHERE id > %s AND id <= %s
        ) AS texts (t)
        WHERE t <> ''
        ON CONFLICT (sha256) DO NOTHING
        """,
        [after, upto, after, upto],
    )
    # A text's blob by its hash; no blob (NULL) for an empty or absent one.
    cursor.execute(
        f"""
        UPDATE matrix_result SET
            source_id = (SELECT id FROM matrix_blob
                         WHERE sha256 = {SHA256.format(SOURCE)}),
            error_id = (SELECT id FROM matrix_blob
                        WHERE sha256 = {SHA256.format("error_message")}),
            error_message = '',
            details = details - 'kernel_source' - 'kernel_source_sha256'
        WHERE id > %s AND id <= %s AND {TO_MOVE}
        """,
        [after, upto],
    )


def sha256(text):
    return hashlib.sha256(text.encode(errors="replace")).hexdigest()


def forward_python(Result, Blob, db, after, upto):
    rows = list(
        Result.objects.using(db)
        .filter(id__gt=after, id__lte=upto)
        .filter(
            Q(details__has_key="kernel_source")
            | Q(details__has_key="kernel_source_sha256")
            | ~Q(error_message="")
        )
        .only("id", "details", "error_message")
    )
    texts = {}
    for row in rows:
        source = row.details.get("kernel_source")
        row.texts = (source if isinstance(source, str) else "", row.error_message)
        texts.update((sha256(t), t) for t in row.texts if t)
    Blob.objects.using(db).bulk_create(
        [Blob(sha256=sha, text=text) for sha, text in sorted(texts.items())],
        ignore_conflicts=True,
    )
    ids = dict(
        Blob.objects.using(db).filter(sha256__in=texts).values_list("sha256", "id")
    )
    for row in rows:
        source, error = row.texts
        row.source_id = ids[sha256(source)] if source else None
        row.error_id = ids[sha256(error)] if error else None
        row.error_message = ""
        row.details.pop("kernel_source", None)
        row.details.pop("kernel_source_sha256", None)
    Result.objects.using(db).bulk_update(
        rows, ["source", "error", "error_message", "details"]
    )


def backward_sql(cursor, after, upto):
    cursor.execute(
        """
        UPDATE matrix_result r SET
            details = r.details || jsonb_build_object(
                'kernel_source', b.text, 'kernel_source_sha256', b.sha256),
            source_id = NULL
        FROM matrix_blob b WHERE b.id = r.source_id AND r.id > %s AND r.id <= %s
        """,
        [after, upto],
    )
    cursor.execute(
        """
        UPDATE matrix_result r SET error_message = b.text, error_id = NULL
        FROM matrix_blob b WHERE b.id = r.error_id AND r.id > %s AND r.id <= %s
        """,
        [after, upto],
    )


def backward_python(Result, Blob, db, after, upto):
    rows = list(
        Result.objects.using(db)
        .filter(id__gt=after, id__lte=upto)
        .filter(Q(source__isnull=False) | Q(error__isnull=False))
        .select_related("source", "error")
        .only("id", "details", "source", "error")
    )
    for row in rows:
        if row.source is not None:
            row.details["kernel_source"] = row.source.text
            row.details["kernel_source_sha256"] = row.source.sha256
        if row.error is not None:
            row.error_message = row.error.text
        row.source = row.error = None
    Result.objects.using(db).bulk_update(
        rows, ["source", "error", "error_message", "details"]
    )


def move(sql, python):
    def run(apps, schema_editor):
        Result = apps.get_model("matrix", "Result")
        Blob = apps.get_model("matrix", "Blob")
        db = schema_editor.connection.alias
        for after, upto in chunks(Result, db):
            with transaction.atomic(using=db):
                if schema_editor.connection.vendor == "postgresql":
                    with schema_editor.connection.cursor() as cursor:
                        sql(cursor, after, upto)
                else:
                    python(Result, Blob, db, after, upto)

    return run


class Migration(migrations.Migration):
    # Each chunk is a transaction of its own (see the docstring).
    atomic = False

    dependencies = [
        ("matrix", "0026_blob"),
    ]

    operations = [
        migrations.RunPython(
            move(forward_sql, forward_python),
            move(backward_sql, backward_python),
            elidable=True,
        ),
    ]
