"""Write the approved manifest of a toolchain as JSON."""

from __future__ import annotations

import json

from django.core.management.base import BaseCommand, CommandError

from matrix.api_manifest import device_named, toolchain_lookup
from matrix.gate.manifest import manifest_for
from matrix.management.commands._files import OutputFile
from matrix.management.commands._options import not_empty
from matrix.models import DeviceType, Toolchain
from matrix.models.gate import ManifestEntry, ProposalState


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
            "--device-type",
            type=not_empty,
            help="only this device type's entries (its name as the entries write "
            "it): what a serving host reads",
        )
        parser.add_argument(
            "--out", type=not_empty, help="file to write instead of standard output"
        )

    def handle(self, *args, toolchain=None, device_type=None, out=None, **options):
        output = OutputFile(out) if out else None
        if not toolchain and not Toolchain.objects.filter(is_current=True).exists():
            # Said here: the API's own message names its query parameter.
            raise CommandError("no toolchain is current; name one with --toolchain")
        device = None
        if device_type is not None:
            device = device_named(device_type)
            if device is None:
                known = ", ".join(sorted(str(d) for d in DeviceType.objects.all()))
                raise CommandError(
                    f"no device type named {device_type!r}; known: {known}"
                )
        try:
            manifest = manifest_for(
                toolchain=toolchain_lookup(toolchain), device_type=device
            )
        except LookupError as exc:
            raise CommandError(str(exc)) from None
        text = json.dumps(manifest, indent=2, sort_keys=True) + "\n"
        if not manifest["entries"]:
            self.stderr.write(self._empty_hint(manifest["toolchain"]["name"]))
        if output:
            output.write(text)
            self.stderr.write(
                f"wrote {len(manifest['entries'])} entries for "
                f"{manifest['toolchain']['name']} to {out}"
            )
        else:
            self.stdout.write(text, ending="")

    @staticmethod
    def _empty_hint(name: str) -> str:
        """Why a manifest has no entries, and where the approved ones are:
        after an upgrade is approved the baseline is still current until it
        is rolled out, and its manifest is empty."""
        approved = (
            ManifestEntry.objects.filter(
                proposal__state__in=[ProposalState.APPROVED, ProposalState.ROLLED_OUT]
            )
            .values_list("proposal__candidate__name", flat=True)
            .distinct()
        )
        others = sorted(set(approved) - {name})
        where = (
            f"approved manifests exist for: {', '.join(others)} (name one with "
            "--toolchain)"
            if others
            else "no upgrade proposal has been approved yet"
        )
        return (
            f"no approved entries for {name}: production reading this serves the "
            f"reference everywhere; {where}"
        )
