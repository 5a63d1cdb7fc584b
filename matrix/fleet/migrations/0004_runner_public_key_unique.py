from django.db import migrations, models
from django.db.models import Count


def refuse_shared_keys(apps, schema_editor):
    """Registration has refused a taken key since before this column was
    unique, but a database older than that check may hold runners sharing
    one: name them, rather than fail on an anonymous unique violation."""
    Runner = apps.get_model("runners", "Runner")
    shared = (
        Runner.objects.values("public_key")
        .annotate(n=Count("pk"))
        .filter(n__gt=1)
        .values_list("public_key", flat=True)
    )
    groups = [
        sorted(Runner.objects.filter(public_key=key).values_list("name", flat=True))
        for key in shared
    ]
    if groups:
        names = "; ".join(", ".join(group) for group in groups)
        raise RuntimeError(
            f"runners share a public key ({names}): delete all but one of each "
            "group in the admin (each host registers a key pair of its own), "
            "then migrate again"
        )


class Migration(migrations.Migration):
    dependencies = [
        ("runners", "0003_spentnonce"),
    ]

    operations = [
        migrations.RunPython(refuse_shared_keys, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="runner",
            name="public_key",
            field=models.CharField(
                help_text="Ed25519 public key, hex", max_length=64, unique=True
            ),
        ),
    ]
