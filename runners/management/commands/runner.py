"""`manage.py runner ...`: registration tokens, registering this host,
approving or refusing a registered runner, running its worker, offline
bundles and revocation."""

from __future__ import annotations

import json
import os
import re
import sys
import time
from datetime import timedelta
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from matrix.management.commands._files import OutputFile, read_json
from matrix.management.commands._options import database_id, not_empty
from matrix.models import Sweep, ValidationJob
from runners import client, host, services, signing
from runners.client import problem
from runners.management.commands.sweep import (
    FILTERS,
    cells_chosen,
    filter_options_add,
    nothing_chosen,
)
from runners.models import Runner

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


def server_url(text: str) -> str:
    try:
        return client.server_url(text)
    except ValueError as exc:
        raise CommandError(str(exc)) from None


def key_dir_check(directory: Path) -> None:
    """Refuse, before registering, a key directory that cannot be written:
    a runner the server accepted but whose key was never kept is lost."""
    existing = next(d for d in (directory, *directory.parents) if d.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise CommandError(
            f"--key-dir {directory}: {existing} is not a directory this user can write"
        )


def post_json(url: str, body: dict, timeout: float = 60) -> tuple[int, dict]:
    """client.post_json, with an unreachable server as a command error."""
    try:
        return client.post_json(url, body, timeout=timeout)
    except client.ServerUnavailable as exc:
        raise CommandError(str(exc)) from None


# The server's health of a runner no runner admin has approved yet
# (Runner.Health.PENDING; the host side reads the word, not the model).
PENDING = "pending"


def awaiting_approval(name: str, server: str) -> str:
    return (
        f"runner {name} is waiting for approval: a runner admin checks its "
        f"inventory and key fingerprint on the Runners page ({server}/runners/) "
        f"and approves it there, or with `manage.py runner approve {name}` on "
        "the server; until then it has no queue"
    )


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

        register = sub.add_parser("register", help="register this host with a server")
        register.add_argument(
            "--server", required=True, type=not_empty, help="http://HOST:PORT"
        )
        register.add_argument("--token", required=True)
        register.add_argument("--name", required=True)
        register.add_argument(
            "--key-dir", type=not_empty, help="where runner.key and runner.json live"
        )
        register.add_argument(
            "--python",
            action="append",
            dest="interpreters",
            type=not_empty,
            help="a toolchain interpreter this host offers (repeatable; default: this one)",
        )
        register.add_argument(
            "--inventory",
            type=not_empty,
            help="an inventory written by `runner probe` on an air-gapped host, "
            "registered from a machine that reaches the server",
        )

        probe = sub.add_parser(
            "probe", help="write this host's inventory (devices, toolchains) as JSON"
        )
        probe.add_argument("--out", required=True, type=not_empty)
        probe.add_argument(
            "--python", action="append", dest="interpreters", type=not_empty
        )

        for name, text in (
            ("work", "run this host's Celery worker and heartbeats"),
            ("queues", "print this host's queues, comma-separated"),
        ):
            p = sub.add_parser(name, help=text)
            p.add_argument("--key-dir", type=not_empty)
            if name == "work":
                p.add_argument(
                    "--concurrency",
                    type=int,
                    default=None,
                    help="messages run at once (default: 1, or on a GPU host "
                    "half its cores up to 8)",
                )
                p.add_argument("--loglevel", default="info")

        execute = sub.add_parser(
            "execute-bundle", help="run signed jobs with no broker"
        )
        execute.add_argument("jobs")
        execute.add_argument("--out", required=True, type=not_empty)
        execute.add_argument("--key-dir", type=not_empty)

        upload = sub.add_parser("upload", help="import a results bundle")
        upload.add_argument("results")
        upload.add_argument(
            "--server",
            type=not_empty,
            help="default: the server this host registered with",
        )
        upload.add_argument("--key-dir", type=not_empty)

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
        handler = getattr(self, "do_" + action.replace("-", "_"))
        handler(**options)

    def do_token(self, *, token_action, expires, **_):
        token = services.token_create(expires=duration(expires))
        self.stdout.write(f"registration token, single use, expires in {expires}:")
        self.stdout.write(token)

    def do_probe(self, *, out, interpreters, **_):
        output = OutputFile(out)
        try:
            inventory = host.inventory_probe(
                interpreters or host.default_interpreters()
            )
        except host.HostError as exc:
            raise CommandError(str(exc)) from None
        output.write(json.dumps(inventory, indent=1) + "\n")
        devices = ", ".join(f"{d['vendor']} {d['model']}" for d in inventory["devices"])
        self.stdout.write(f"inventory of {devices} in {out}")

    def do_register(
        self, *, server, token, name, key_dir, interpreters, inventory, **_
    ):
        server = server_url(server)
        directory = host.runner_dir(key_dir)
        key_path = directory / "runner.key"
        key_dir_check(directory)
        kept_key = key_path.exists()
        if kept_key:
            try:
                key = signing.key_read(key_path)
            except (OSError, ValueError) as exc:
                raise CommandError(f"cannot read {key_path}: {exc}") from None
        else:
            # Kept only once the server accepts it: a refused registration
            # leaves nothing behind.
            key = Ed25519PrivateKey.generate()
        if inventory:
            inventory = read_json(inventory)
        else:
            try:
                inventory = host.inventory_probe(
                    interpreters or host.default_interpreters()
                )
            except host.HostError as exc:
                raise CommandError(str(exc)) from None
        status, reply = post_json(
            server + "/api/v1/runners/register",
            {
                "token": token,
                "name": name,
                "public_key": signing.public_key_hex(key),
                "inventory": inventory,
            },
        )
        if status != 201:
            why = problem(reply)
            if kept_key and status == 409 and "public key" in why:
                why += (
                    f"; {key_path} holds that key: move it away, or give another "
                    "--key-dir, to register with a new one"
                )
            raise CommandError(f"registration refused ({status}): {why}")
        if not kept_key:
            signing.key_write(key_path, key)
        config = host.HostConfig(
            directory=directory,
            name=reply["name"],
            server=server,
            server_public_key=reply["server_public_key"],
            queues=reply["queues"],
            toolchains={
                t["fingerprint"]: {
                    "interpreter": t["interpreter"],
                    "name": t["name"],
                    "id": t["id"],
                }
                for t in reply["toolchains"]
            },
        )
        config.save()
        devices = ", ".join(f"{d['vendor']} {d['model']}" for d in inventory["devices"])
        self.stdout.write(
            f"registered runner {reply['name']} (id {reply['id']}): {devices}; "
            f"key fingerprint {reply['key_fingerprint']}"
        )
        self.stdout.write(awaiting_approval(reply["name"], server))

    def _config(self, key_dir) -> host.HostConfig:
        try:
            return host.HostConfig.load(host.runner_dir(key_dir))
        except host.HostError as exc:
            raise CommandError(str(exc)) from None

    def _queues(self, config: host.HostConfig) -> tuple[list[str], str]:
        """The runner's queues and health, as the server sees them now."""
        # The server's view wins: device types or toolchains may have changed.
        # Asked over HTTP: a runner host holds no database credentials.
        try:
            reply = client.signed_request(config, "queues")
        except client.ServerRefused as exc:
            if exc.status == 403 and exc.detail.startswith("unknown runner"):
                raise CommandError(
                    f"the server does not know runner {config.name!r} "
                    "(its database was reset?): register again"
                ) from None
            if exc.status == 403 and exc.detail.endswith("is refused"):
                raise CommandError(
                    f"runner {config.name} was refused by a runner admin: it takes "
                    "no work (register again under another name, with a new key, "
                    "if that was a mistake)"
                ) from None
            raise CommandError(f"queues {exc}") from None
        except client.ServerUnavailable as exc:
            raise CommandError(str(exc)) from None
        return reply["queues"], reply.get("health", host.ACTIVE)

    def _approved_queues(self, config: host.HostConfig) -> list[str]:
        """The runner's queues once a runner admin has approved it: a pending
        runner waits here, asking every heartbeat interval, so that a worker
        started right after `register` (by hand or by systemd) begins work
        as soon as it is approved, and a refused one stops with the reason."""
        queues, health = self._queues(config)
        if health != PENDING:
            return queues
        poll_s = services.heartbeat_interval_s()
        self.stdout.write(
            awaiting_approval(config.name, config.server)
            + f"; asking again every {poll_s:g} s (Ctrl-C stops)"
        )
        self.stdout.flush()
        while health == PENDING:
            time.sleep(poll_s)
            queues, health = self._queues(config)
        self.stdout.write(f"runner {config.name} approved: starting its worker")
        return queues

    def do_queues(self, *, key_dir, **_):
        config = self._config(key_dir)
        queues, health = self._queues(config)
        if health == PENDING:
            self.stderr.write(awaiting_approval(config.name, config.server))
        self.stdout.write(",".join(queues))

    def do_work(self, *, key_dir, concurrency, loglevel, **_):
        from matrix.celery import app

        config = self._config(key_dir)
        os.environ[host.RUNNER_DIR_ENV] = str(config.directory)
        queues = self._approved_queues(config)
        concurrency = concurrency or host.work_processes()
        host.share_cores(concurrency)
        app.worker_main(
            [
                "worker",
                f"--queues={','.join(queues)}",
                f"--hostname={config.name}@%h",
                f"--concurrency={concurrency}",
                f"--loglevel={loglevel}",
                "--without-gossip",
                "--without-mingle",
            ]
        )

    def do_execute_bundle(self, *, jobs, out, key_dir, **_):
        output = OutputFile(out)
        config = self._config(key_dir)
        bundle = read_json(jobs)
        envelopes = bundle.get("jobs") if isinstance(bundle, dict) else None
        if not isinstance(envelopes, list):
            raise CommandError(f'{jobs} is not a jobs bundle ({{"jobs": [...]}})')
        if not envelopes:
            raise CommandError(
                f"{jobs} holds no jobs: nothing to run; {out} not written"
            )
        results, skipped = host.bundle_execute(envelopes=envelopes, config=config)
        for reason in skipped:
            self.stderr.write(f"skipped {reason}")
        if not results:
            # Not written: an empty results file is one `runner upload`
            # refuses, and writing it would replace the results of an
            # earlier run at that path not yet uploaded.
            raise CommandError(
                f"every one of the {len(skipped)} messages in {jobs} was skipped "
                f"(reasons above): no job ran; {out} not written"
            )
        for i, signed in enumerate(results, start=1):
            status = signed["payload"]["result"].get("status")
            self.stdout.write(
                f"[{i}/{len(results)}] job {signed['payload']['job']}: {status}"
            )
        output.write(json.dumps({"results": results}) + "\n")
        self.stdout.write(
            f"{len(results)} signed results in {out}; {len(skipped)} messages skipped"
        )
        if skipped:
            sys.exit(1)

    def do_upload(self, *, results, server, key_dir, **_):
        server = server_url(server or self._config(key_dir).server)
        bundle = read_json(results)
        envelopes = bundle.get("results") if isinstance(bundle, dict) else None
        if not isinstance(envelopes, list) or not envelopes:
            raise CommandError(
                f'{results} is not a results bundle ({{"results": [...]}})'
            )
        batches = client.upload_batches(envelopes)
        stored = duplicate = 0
        refused = []

        def batch_failed(number: int, batch: range, why: str) -> CommandError:
            # What the batches before it stored stays stored: sending the
            # file again counts those as already stored.
            before = (
                f"; the batches before it: {stored} stored, {duplicate} already "
                f"stored, {len(refused)} refused"
                if number > 1
                else ""
            )
            return CommandError(
                f"batch {number} of {len(batches)} (results {batch.start}-"
                f"{batch.stop - 1}){why}{before}"
            )

        for number, batch in enumerate(batches, start=1):
            try:
                status, reply = client.post_json(
                    server + "/api/v1/results",
                    {"results": envelopes[batch.start : batch.stop]},
                    timeout=600,
                )
            except client.ServerUnavailable as exc:
                raise batch_failed(number, batch, f": {exc}") from None
            if status != 200:
                raise batch_failed(
                    number, batch, f" refused ({status}): {problem(reply)}"
                )
            stored += reply["stored"]
            duplicate += reply["duplicate"]
            # The server counts within the batch; the file's index is wanted.
            refused += [
                (batch.start + r["index"], r["reason"]) for r in reply["refused"]
            ]
        self.stdout.write(
            f"{stored} stored, {duplicate} already stored, {len(refused)} refused"
        )
        for index, reason in refused:
            self.stderr.write(f"  result {index}: {reason}")
        if refused:
            sys.exit(1)

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
            services.runner_revoke(name=name)
        except ValidationError as exc:
            raise CommandError("; ".join(exc.messages)) from None
        self.stdout.write(
            f"runner {name} revoked: its next heartbeat and result are refused"
        )
