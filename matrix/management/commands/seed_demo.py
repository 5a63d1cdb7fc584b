from __future__ import annotations

from django.core.management.base import BaseCommand

from matrix.services import catalog_seed


class Command(BaseCommand):
    help = "Seed the demo catalogue (device types, library operators, served shapes). Idempotent."

    def handle(self, *args, **options):
        counts = catalog_seed()
        self.stdout.write(
            "catalogue: {device_types} device types, {operators} operators, "
            "{shapes} shapes ({served} served)".format(**counts)
        )
