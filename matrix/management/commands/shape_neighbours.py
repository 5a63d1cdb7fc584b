"""Add the neighbours of every served shape (matrix/neighbours.py)."""

from __future__ import annotations

from django.core.management.base import BaseCommand

from matrix.neighbours import neighbours_add


class Command(BaseCommand):
    help = (
        "Add, as shapes of their own, the neighbours of every served shape "
        "(each dim +1 and -1, 8 mod 16, a unit leading dim, one trip of the "
        "last): the gaps page and Run missing then plan them beside the "
        "served cells."
    )

    def handle(self, *args, **options):
        added = neighbours_add()
        self.stdout.write(f"{added} neighbour shapes added")
