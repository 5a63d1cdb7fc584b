"""`manage.py runner ...`: registration tokens, approving or refusing a
registered runner, offline bundles, maintenance and revocation; and the
runner agent's host commands (register, probe, work, queues,
execute-bundle, upload: ``runners.cli``, also ``tilematrix-runner``)."""

from __future__ import annotations

import json
import re
from datetime import timedelta

from django.core.exceptions import PermissionDenied, ValidationError
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from matrix.fleet import broker_access, services
from matrix.fleet.models import Runner
from matrix.management.commands._files import OutputFile
from matrix.management.commands._options import database_id, not_empty
from matrix.management.commands.sweep import (
    FILTERS,
    cells_chosen,
    filter_options_add,
    nothing_chosen,
)
from matrix.models import Sweep, ValidationJob
from runners import cli

DURATION = re.compile(r"^(\d+)([smhd])$")
SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
# A registration token is for a host about to be set up; one that lives
# longer is a standing credential.
TOKEN_LIFETIME_MAX = timedelta(days=30)


def duration(text: str) -> timedelta:
    match = DURATION.match(text.strip())
    if not match:
        raise CommandError(
            f"--expires takes a number and s/m/h/d, like 1h; got {text!r}"
        )
    # Whole seconds, compared before a timedelta is made: one past
    # 999999999 days overflows.
    seconds = int(match[1]) * SECONDS[match[2]]
    if not 0 < seconds <= TOKEN_LIFETIME_MAX.total_seconds():
        raise CommandError(
            f"--expires must be more than 0s and at most "
            f"{TOKEN_LIFETIME_MAX.days}d; got {text!r}"
        )
    return timedelta(seconds=seconds)


def is_bundle_of(sweep_id: int, runner_name: str) -> bool:
    """Whether a sweep's jobs went to that runner's offline bundle (planned
    as one, or recreated from its evidence)."""
    return ValidationJob.objects.filter(
        sweep_id=sweep_id, queue=f"bundle.{runner_name}"
    ).exists()


class Command(BaseCommand):
    help = (
        "Runner hosts: token create, register, approve, refuse, work, queues, "
        "execute-bundle, upload, bundle, bundle-abandon, maintenance, revoke."
    )

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)

        token = sub.add_parser("token", help="registration tokens")
        token_sub = token.add_subparsers(dest="token_action", required=True)
        create = token_sub.add_parser("create", help="print a new single-use token")
        create.add_argument("--expires", default="1h", help="lifetime: 30m, 1h, 2d")

        cli.host_arguments_add(sub)

        bundle = sub.add_parser("bundle", help="plan signed jobs for an offline runner")
        bundle.add_argument("name")
        bundle.add_argument("--out", required=True, type=not_empty)
        filter_options_add(bundle)

        abandon = sub.add_parser(
            "bundle-abandon",
            help="give up a runner's bundles that will not come home (their cells "
            "can be planned again)",
        )
        abandon.add_argument("name")
        abandon.add_argument(
            "--sweep", type=database_id, help="only this bundle's sweep"
        )

        maintenance = sub.add_parser(
            "maintenance",
            help="give a runner no work (on) or work again (off); its worker may "
            "keep running",
        )
        maintenance.add_argument("name")
        maintenance.add_argument("switch", choices=["on", "off"])

        for action, text in (
            (
                "approve",
                "give a pending runner its queues, after checking its inventory",
            ),
            ("refuse", "refuse a pending runner (revokes its key)"),
        ):
            sub.add_parser(action, help=text).add_argument("name")

        revoke = sub.add_parser(
            "revoke", help="refuse a runner's next heartbeat and result"
        )
        revoke.add_argument("name")

    def handle(self, *args, action, **options):
        if action in cli.HOST_ACTIONS:
            # The runner agent's own commands (``tilematrix-runner``).
            try:
                cli.HostCommands(self.stdout, self.stderr).run(action, options)
            except cli.Refused as exc:
                raise CommandError(str(exc)) from None
            return
        handler = getattr(self, "do_" + action.replace("-", "_"))
        handler(**options)

    def do_token(self, *, token_action, expires, **_):
        token = services.token_create(expires=duration(expires))
        self.stdout.write(f"registration token, single use, expires in {expires}:")
        self.stdout.write(token)

    def do_bundle(self, *, name, out, **options):
        output = OutputFile(out)
        filters = {k: options[k] for k in FILTERS if options[k]}
        cells = cells_chosen(**filters)
        try:
            # One transaction with the write: jobs are assigned to the runner
            # as they are planned, and a bundle that never reached the disk
            # would leave them running for nobody.
            with transaction.atomic():
                sweep, envelopes = services.bundle_plan(runner_name=name, cells=cells)
                if sweep.total:
                    output.write(
                        json.dumps({"sweep": sweep.pk, "jobs": envelopes}) + "\n"
                    )
                else:
                    transaction.set_rollback(True)
        except (PermissionDenied, ValidationError) as exc:
            raise CommandError(
                "; ".join(getattr(exc, "messages", [str(exc)]))
            ) from None
        if not sweep.total:
            why = (
                f"of the {len(cells)} cells chosen, none is on a toolchain it "
                "hosts without an open job and with an approved current revision"
                if cells
                else nothing_chosen(filters)
            )
            self.stdout.write(f"nothing to plan for {name}: {why}; {out} not written")
            return
        self.stdout.write(
            f"sweep {sweep.pk}: {sweep.total} signed jobs for {name} in {out}"
        )

    def do_bundle_abandon(self, *, name, sweep, **_):
        if sweep is not None and not Sweep.objects.filter(pk=sweep).exists():
            raise CommandError(f"there is no sweep {sweep}")
        try:
            ended = services.bundle_abandon(runner_name=name, sweep_id=sweep)
        except ValidationError as exc:
            raise CommandError("; ".join(exc.messages)) from None
        which = f"sweep {sweep}" if sweep is not None else "its bundles"
        if not ended and sweep is not None and not is_bundle_of(sweep, name):
            raise CommandError(
                f"sweep {sweep} is not a bundle of runner {name}: nothing abandoned"
            )
        if not ended:
            self.stdout.write(f"runner {name} has no open bundle job in {which}")
            return
        self.stdout.write(
            f"{ended} bundle jobs of runner {name} ({which}) ended lost: their "
            "cells can be planned again, and their results, if they come, are refused"
        )

    def do_maintenance(self, *, name, switch, **_):
        runner = Runner.objects.filter(name=name).first()
        if runner is None:
            raise CommandError(f"no runner named {name!r}")
        health = Runner.Health.MAINTENANCE if switch == "on" else Runner.Health.ACTIVE
        try:
            sent = services.runner_health_set(runner=runner, health=health)
        except ValidationError as exc:
            raise CommandError("; ".join(exc.messages)) from None
        if switch == "on":
            self.stdout.write(
                f"runner {name} in maintenance: it claims nothing, and its worker "
                "gives back the job messages it receives and waits"
            )
        else:
            self.stdout.write(
                f"runner {name} active: {sent} queued jobs on its queues sent again"
            )

    def do_approve(self, *, name, **_):
        self._decide(name, services.runner_approve, "approved: it has its queues")

    def do_refuse(self, *, name, **_):
        self._decide(
            name, services.runner_refuse, "refused: its key is revoked, its name kept"
        )

    def _decide(self, name: str, decide, outcome: str) -> None:
        try:
            runner = decide(name=name)
        except ValidationError as exc:
            raise CommandError("; ".join(exc.messages)) from None
        claims = runner.claims()
        toolchains = ", ".join(
            f"{t['name']} ({t['fingerprint'][:12]})" for t in claims["toolchains"]
        )
        self.stdout.write(
            f"runner {name} {outcome}\n"
            f"  host         {claims['host'] or '(not given)'}\n"
            f"  key          {claims['key_fingerprint']}\n"
            f"  devices      {', '.join(claims['devices']) or 'none'}\n"
            f"  toolchains   {toolchains}\n"
            f"  nvcc         {'yes' if claims['nvcc'] else 'no'}"
        )

    def do_revoke(self, *, name, **_):
        try:
            runner = services.runner_revoke(name=name)
        except ValidationError as exc:
            raise CommandError("; ".join(exc.messages)) from None
        self.stdout.write(
            f"runner {name} revoked: its next heartbeat and result are refused"
        )
        closed = runner.broker_connections_closed
        if not broker_access.enabled():
            return
        if closed is None:
            self.stderr.write(
                "its broker user could not be deleted now (the broker's management "
                "API did not answer); the reaper deletes it once it answers"
            )
        else:
            self.stdout.write(
                f"its broker user is deleted and {closed} open connections closed"
            )
