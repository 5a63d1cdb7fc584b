from django.db import migrations, models


class Migration(migrations.Migration):
    """The cell tally index in device type column order, so one column's
    counts are a range of it (matrix.views.matrix.kept_cell_groups)."""

    dependencies = [
        ("matrix", "0015_result_history_newest_index"),
    ]

    operations = [
        migrations.RemoveIndex(model_name="cell", name="cell_tally"),
        migrations.AddIndex(
            model_name="cell",
            index=models.Index(
                fields=["toolchain", "device_type", "revision", "status"],
                name="cell_tally",
            ),
        ),
    ]
