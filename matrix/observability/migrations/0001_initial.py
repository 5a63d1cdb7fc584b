from __future__ import annotations

from django.db import migrations, models

# The reasons of matrix.observability.ingest when this was written: each
# gets its row now, so a scrape shows every reason at 0 from the start.
REASONS = (
    "bad_signature",
    "expired",
    "malformed",
    "unknown_runner",
    "revoked_runner",
    "not_assigned",
    "replay",
    "no_job",
    "job_lost",
    "attempt_superseded",
    "invalid_result",
    "other",
)


def reasons_create(apps, schema_editor):
    IngestRefusal = apps.get_model("observability", "IngestRefusal")
    IngestRefusal.objects.bulk_create(
        [IngestRefusal(reason=r) for r in REASONS], ignore_conflicts=True
    )


class Migration(migrations.Migration):
    initial = True
    dependencies = []

    operations = [
        migrations.CreateModel(
            name="IngestRefusal",
            fields=[
                (
                    "reason",
                    models.CharField(max_length=40, primary_key=True, serialize=False),
                ),
                ("count", models.BigIntegerField(default=0)),
            ],
        ),
        migrations.RunPython(reasons_create, migrations.RunPython.noop),
    ]
