from __future__ import annotations

from django.apps import apps
from django.core.management.base import BaseCommand, CommandError
from django.db import connection

from matrix.services import catalog_seed


def tables_missing() -> list[str]:
    """The catalogue's tables this database lacks: a database never migrated
    would otherwise fail on the first query with "no such table"."""
    wanted = {
        model._meta.db_table for model in apps.get_app_config("matrix").get_models()
    }
    return sorted(wanted - set(connection.introspection.table_names()))


class Command(BaseCommand):
    help = "Seed the demo catalogue (device types, library operators, served shapes). Idempotent."

    def handle(self, *args, **options):
        missing = tables_missing()
        if missing:
            raise CommandError(
                f"the database lacks {len(missing)} tables ({', '.join(missing[:3])}"
                f"{', ...' if len(missing) > 3 else ''}): run `manage.py migrate` first"
            )
        counts = catalog_seed()
        self.stdout.write(
            "catalogue: {device_types} device types, {operators} operators, "
            "{shapes} shapes ({served} served)".format(**counts)
        )
