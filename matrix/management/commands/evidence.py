from __future__ import annotations

import json
from pathlib import Path

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from matrix.fleet.evidence import evidence_export, evidence_import
from matrix.gate.sustained import sustained_import
from matrix.management.commands._files import OutputFile, read_json
from matrix.management.commands._options import database_id, not_empty
from matrix.models import Sweep


class Command(BaseCommand):
    help = (
        "Evidence files: export an offline bundle's sweep with the signed results "
        "that came home; import one into this server through the normal ingest."
    )

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        export = sub.add_parser("export", help="write a sweep's evidence file")
        export.add_argument(
            "--sweep",
            type=database_id,
            action="append",
            required=True,
            help="repeatable",
        )
        export.add_argument(
            "--results",
            required=True,
            type=not_empty,
            help="the runner's signed results.json",
        )
        export.add_argument(
            "--measured",
            type=not_empty,
            help="a JSON file of figures to keep with it (its timings)",
        )
        export.add_argument("--out", required=True, type=not_empty)
        imp = sub.add_parser("import", help="replay evidence files into this server")
        imp.add_argument("files", nargs="+")
        imp.add_argument(
            "--current-if-none",
            action="store_true",
            help="make the evidence's toolchain current where none is (the demo)",
        )
        sustained = sub.add_parser(
            "import-sustained",
            help="keep the speeds a bench/sustained_speed.py run measured at the "
            "power cap, for the operators' current revisions: the manifest serves "
            "the reference where they say slower",
        )
        sustained.add_argument("file")
        sustained.add_argument(
            "--toolchain",
            type=not_empty,
            help="the toolchain it ran (default: the one of the file's TileLang)",
        )

    def handle(self, *args, action, **options):
        getattr(self, f"do_{action.replace('-', '_')}")(**options)

    def do_export(self, *, sweep, results, measured, out, **_):
        output = OutputFile(out)
        found = list(Sweep.objects.filter(pk__in=sweep))
        if len(found) != len(set(sweep)):
            raise CommandError(f"not every sweep of {sweep} exists here")
        bundle = read_json(results)
        if not isinstance(bundle, dict) or "results" not in bundle:
            raise CommandError(
                f'{results} is not a results bundle ({{"results": [...]}})'
            )
        try:
            data = evidence_export(
                sweeps=found,
                results=bundle["results"],
                measured=read_json(measured) if measured else {},
            )
        except ValidationError as exc:
            raise CommandError("; ".join(exc.messages)) from None
        output.write(json.dumps(data, indent=1) + "\n")
        self.stdout.write(
            f"{len(data['jobs'])} jobs, {len(data['results'])} results in {out}"
        )

    def do_import(self, *, files, current_if_none, **_):
        failed = False
        for name in files:
            try:
                counts = evidence_import(
                    read_json(name), current_if_none=current_if_none
                )
            except ValidationError as exc:
                raise CommandError(f"{name}: {'; '.join(exc.messages)}") from None
            self.stdout.write(
                f"{name}: {counts['stored']} stored, {counts['duplicate']} already "
                f"stored, {len(counts['refused'])} refused"
            )
            for reason in counts["refused"]:
                self.stderr.write(f"  {reason}")
            failed |= bool(counts["refused"])
        if failed:
            raise CommandError("some results were refused (reasons above)")

    def do_import_sustained(self, *, file, toolchain, verbosity, **_):
        try:
            outcome = sustained_import(
                read_json(file), source=Path(file).name, toolchain_name=toolchain
            )
        except ValidationError as exc:
            raise CommandError(f"{file}: {'; '.join(exc.messages)}") from None
        self.stdout.write(
            f"{file}: {outcome.stored} speeds kept, {outcome.failed} cells without "
            f"one (not passing), {outcome.stale} of another kernel revision, "
            f"{len(outcome.unknown)} not in this catalogue"
        )
        for where in outcome.unknown if verbosity > 1 else ():
            self.stdout.write(f"  not here: {where}")
