from __future__ import annotations

import os
import secrets
from pathlib import Path

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from matrix.accounts.roles import VIEWER
from matrix.alerts.services import alert_bisect, alert_bisectable
from matrix.gate.evidence import evidence_upgrades
from matrix.gate.services import proposal_approve, proposal_open
from matrix.management.commands._files import read_json
from matrix.models.alerts import Alert
from matrix.models.gate import Policy, UpgradeProposal

REVIEWERS = ("reviewer1", "reviewer2")


class Command(BaseCommand):
    help = (
        "The demo's upgrade: reviewer accounts (reviewer1, reviewer2; passwords "
        "generated and printed once), and a proposal, opened by the admin, for "
        "every A/B an imported evidence file holds (a device type validated with "
        "two TileLang releases), and a bisection across toolchains for every "
        "open alert with a toolchain pair not bisected yet. Running it again "
        "changes nothing."
    )

    def add_arguments(self, parser):
        parser.add_argument("files", nargs="*", help="imported evidence files")
        parser.add_argument(
            "--approve",
            action="store_true",
            help="approve each of them as both demo reviewers, so that the "
            "candidate's manifest serves what its evidence says (scripts/"
            "demo-manifest exports it)",
        )

    def handle(self, *args, files, approve=False, **options):
        self.reviewers_ensure()
        proposer = self.proposer()
        # One A/B may span files (a lab exports a file per toolchain's sweep):
        # the jobs of every file are read together.
        jobs = []
        for name in files:
            data = read_json(name)
            jobs += (data.get("jobs") or []) if isinstance(data, dict) else []
        reports = ", ".join(
            "docs/evidence/" + Path(name).name.replace(".evidence.json", ".md")
            for name in files
        )
        for upgrade in evidence_upgrades({"jobs": jobs}):
            proposal = self.proposal_ensure(upgrade, proposer=proposer, reports=reports)
            if approve:
                self.proposal_approve(proposal)
        self.alerts_bisect(by=proposer)

    def proposal_approve(self, proposal: UpgradeProposal) -> None:
        for username in REVIEWERS:
            reviewer = get_user_model().objects.get(username=username)
            try:
                proposal_approve(
                    proposal=proposal,
                    by=reviewer,
                    comment="demo: approved as its evidence stands",
                )
            except ValidationError as exc:
                raise CommandError(
                    f"upgrade #{proposal.pk}: {'; '.join(exc.messages)}"
                ) from None
        proposal.refresh_from_db()
        self.stdout.write(f"upgrade #{proposal.pk}: {proposal.state}")

    def reviewers_ensure(self) -> None:
        User = get_user_model()
        groups = [
            Group.objects.get_or_create(name=Policy.current().reviewer_group)[0],
            Group.objects.get_or_create(name=VIEWER)[0],
        ]
        for username in REVIEWERS:
            if User.objects.filter(username=username).exists():
                self.stdout.write(f"reviewer account {username!r} exists")
                continue
            password = secrets.token_urlsafe(12)
            user = User.objects.create_user(username=username, password=password)
            user.groups.add(*groups)
            self.stdout.write(
                self.style.WARNING(
                    f"reviewer account: {username} / {password}  (shown once)"
                )
            )

    def proposer(self):
        """The admin ensure_admin made: the demo's proposals are theirs, so
        the two reviewers may decide."""
        username = os.environ.get("DJANGO_SUPERUSER_USERNAME") or "admin"
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(
                f"no admin account {username!r}: run `manage.py ensure_admin` first"
            )
        return user

    def proposal_ensure(self, upgrade, *, proposer, reports: str) -> UpgradeProposal:
        wanted = {dt.pk for dt in upgrade.device_types}
        for proposal in UpgradeProposal.objects.filter(
            baseline=upgrade.baseline, candidate=upgrade.candidate
        ).prefetch_related("device_types"):
            if {dt.pk for dt in proposal.device_types.all()} == wanted:
                self.stdout.write(
                    f"upgrade #{proposal.pk} ({upgrade}) exists: {proposal.state}"
                )
                return proposal
        try:
            proposal = proposal_open(
                baseline=upgrade.baseline,
                candidate=upgrade.candidate,
                device_types=upgrade.device_types,
                by=proposer,
                note=(
                    f"A real A/B from evidence: TileLang "
                    f"{upgrade.baseline.tilelang_version} → "
                    f"{upgrade.candidate.tilelang_version}, both toolchains run by "
                    f"the same runner. Reports: {reports}"
                ),
            )
        except ValidationError as exc:
            raise CommandError(f"{upgrade}: {'; '.join(exc.messages)}") from None
        self.stdout.write(
            self.style.SUCCESS(
                f"upgrade #{proposal.pk} opened ({upgrade}): {proposal.state}; "
                f"{', '.join(REVIEWERS)} may decide on it"
            )
        )
        return proposal

    def alerts_bisect(self, *, by) -> None:
        """What a reviewer pressing Bisect on each open alert gets: with the
        lab's results stored and no runner online, the releases between
        that nobody tested are named with what would test them."""
        for alert in Alert.objects.open().filter(bisection__isnull=True).order_by("pk"):
            if not alert_bisectable(alert):
                continue
            try:
                bisection = alert_bisect(alert=alert, by=by)
            except ValidationError as exc:
                self.stdout.write(f"alert #{alert.pk}: {'; '.join(exc.messages)}")
                continue
            self.stdout.write(
                f"alert #{alert.pk} ({alert.cell_count} cells): bisection "
                f"#{bisection.pk} {bisection.get_state_display()}"
            )
