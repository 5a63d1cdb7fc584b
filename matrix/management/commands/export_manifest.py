"""Write the approved manifest of a toolchain as JSON."""

from __future__ import annotations

import json

from django.core.management.base import BaseCommand, CommandError

from matrix.api_manifest import toolchain_lookup
from matrix.gate.manifest import manifest_for
from matrix.management.commands._files import OutputFile
from matrix.management.commands._options import not_empty
from matrix.models import Toolchain


class Command(BaseCommand):
    help = (
        "Print (or write with --out) the approved (operator, dtype, device type, "
        "shape rule) -> tilelang|reference table for a toolchain."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--toolchain",
            type=not_empty,
            help="name or fingerprint; default: the current toolchain",
        )
        parser.add_argument(
            "--out", type=not_empty, help="file to write instead of standard output"
        )

    def handle(self, *args, toolchain=None, out=None, **options):
        output = OutputFile(out) if out else None
        if not toolchain and not Toolchain.objects.filter(is_current=True).exists():
            # Said here: the API's own message names its query parameter.
            raise CommandError("no toolchain is current; name one with --toolchain")
        try:
            manifest = manifest_for(toolchain=toolchain_lookup(toolchain))
        except LookupError as exc:
            raise CommandError(str(exc)) from None
        text = json.dumps(manifest, indent=2, sort_keys=True) + "\n"
        if output:
            output.write(text)
            self.stderr.write(
                f"wrote {len(manifest['entries'])} entries for "
                f"{manifest['toolchain']['name']} to {out}"
            )
        else:
            self.stdout.write(text, ending="")
