"""``tilematrix-runner``: what a lab admin types on a runner host. It
registers the host with a server, writes its inventory, runs its worker,
runs an offline bundle and uploads its results; it needs no database, no
Django and no checkout of the server (``python -m runners`` too).

The server's ``manage.py runner`` takes the same host commands (they are
this module's) beside its own: tokens, approval, bundles, revocation.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from runners import broker_login, client, host, protocol, signing
from runners import config as agent_config
from runners.files import FileProblem, OutputFile, read_json
from runners.protocol import PENDING

HOST_ACTIONS = ("register", "probe", "work", "queues", "execute-bundle", "upload")


class Refused(Exception):
    """A command that cannot do what was asked; the message says why."""


def not_empty(text: str) -> str:
    """A value given but empty is refused: dropped, it would quietly widen a
    filter to everything or fall back to a default nobody asked for."""
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return text


def server_url(text: str) -> str:
    try:
        return client.server_url(text)
    except ValueError as exc:
        raise Refused(str(exc)) from None


def key_dir_check(directory: Path) -> None:
    """Refuse, before registering, a key directory that cannot be written:
    a runner the server accepted but whose key was never kept is lost."""
    existing = next(d for d in (directory, *directory.parents) if d.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise Refused(
            f"--key-dir {directory}: {existing} is not a directory this user can write"
        )


def post_json(url: str, body: dict, timeout: float = 60) -> tuple[int, dict]:
    """client.post_json, with an unreachable server as a refusal."""
    try:
        return client.post_json(url, body, timeout=timeout)
    except client.ServerUnavailable as exc:
        raise Refused(str(exc)) from None


def awaiting_approval(name: str, server: str) -> str:
    return (
        f"runner {name} is waiting for approval: a runner admin checks its "
        f"inventory and key fingerprint on the Runners page ({server}/runners/) "
        f"and approves it there, or with `manage.py runner approve {name}` on "
        "the server; until then it has no queue"
    )


def host_arguments_add(sub) -> None:
    """The host commands' parsers, on ``sub`` (argparse subparsers)."""
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
    probe.add_argument("--python", action="append", dest="interpreters", type=not_empty)

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

    execute = sub.add_parser("execute-bundle", help="run signed jobs with no broker")
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


class HostCommands:
    """The host commands, writing to ``out`` and ``err``. A command that
    cannot go on raises Refused; one that did part of its work and must say
    so to a script exits 1 (SystemExit)."""

    def __init__(self, out=sys.stdout, err=sys.stderr):
        self.out, self.err = out, err

    def say(self, line: str) -> None:
        self.out.write(line.rstrip("\n") + "\n")

    def warn(self, line: str) -> None:
        self.err.write(line.rstrip("\n") + "\n")

    def run(self, action: str, options: dict) -> None:
        try:
            getattr(self, "do_" + action.replace("-", "_"))(**options)
        except FileProblem as exc:
            raise Refused(str(exc)) from None

    def do_probe(self, *, out, interpreters, **_):
        output = OutputFile(out)
        try:
            inventory = host.inventory_probe(
                interpreters or host.default_interpreters()
            )
        except host.HostError as exc:
            raise Refused(str(exc)) from None
        output.write(json.dumps(inventory, indent=1) + "\n")
        devices = ", ".join(f"{d['vendor']} {d['model']}" for d in inventory["devices"])
        self.say(f"inventory of {devices} in {out}")

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
                raise Refused(f"cannot read {key_path}: {exc}") from None
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
                raise Refused(str(exc)) from None
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
            why = client.problem(reply)
            if kept_key and status == 409 and "public key" in why:
                why += (
                    f"; {key_path} holds that key: move it away, or give another "
                    "--key-dir, to register with a new one"
                )
            raise Refused(f"registration refused ({status}): {why}")
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
        self.say(
            f"registered runner {reply['name']} (id {reply['id']}): {devices}; "
            f"key fingerprint {reply['key_fingerprint']}"
        )
        self.say(awaiting_approval(reply["name"], server))

    def _config(self, key_dir) -> host.HostConfig:
        try:
            return host.HostConfig.load(host.runner_dir(key_dir))
        except host.HostError as exc:
            raise Refused(str(exc)) from None

    def _queues(self, config: host.HostConfig) -> tuple[list[str], str]:
        """The runner's queues and health, as the server sees them now."""
        reply = self._queues_reply(config)
        return reply["queues"], reply.get("health", host.ACTIVE)

    def _queues_reply(self, config: host.HostConfig) -> dict:
        """The server's queues reply: queues, health and, where the server
        gives each runner a broker user, its login (``broker``)."""
        # The server's view wins: device types or toolchains may have changed.
        # Asked over HTTP: a runner host holds no database credentials.
        try:
            reply = client.signed_request(config, "queues")
        except client.ServerRefused as exc:
            if exc.status == 403 and exc.detail.startswith("unknown runner"):
                raise Refused(
                    f"the server does not know runner {config.name!r} "
                    "(its database was reset?): register again"
                ) from None
            if exc.status == 403 and exc.detail.endswith("is refused"):
                raise Refused(
                    f"runner {config.name} was refused by a runner admin: it takes "
                    "no work (register again under another name, with a new key, "
                    "if that was a mistake)"
                ) from None
            raise Refused(f"queues {exc}") from None
        except client.ServerUnavailable as exc:
            raise Refused(str(exc)) from None
        return reply

    def _approved(self, config: host.HostConfig) -> dict:
        """The queues reply once a runner admin has approved it: a pending
        runner waits here, asking every heartbeat interval, so that a worker
        started right after `register` (by hand or by systemd) begins work
        as soon as it is approved, and a refused one stops with the reason."""
        reply = self._queues_reply(config)
        if reply.get("health") != PENDING:
            return reply
        poll_s = agent_config.heartbeat_interval_s()
        self.say(
            awaiting_approval(config.name, config.server)
            + f"; asking again every {poll_s:g} s (Ctrl-C stops)"
        )
        self.out.flush()
        while reply.get("health") == PENDING:
            time.sleep(poll_s)
            reply = self._queues_reply(config)
        self.say(f"runner {config.name} approved: starting its worker")
        return reply

    def do_queues(self, *, key_dir, **_):
        config = self._config(key_dir)
        queues, health = self._queues(config)
        if health == PENDING:
            self.warn(awaiting_approval(config.name, config.server))
        self.say(",".join(queues))

    def do_work(self, *, key_dir, concurrency, loglevel, **_):
        from runners.app import app

        config = self._config(key_dir)
        try:  # read in the worker's children; a bad value stops it here
            agent_config.kernel_cache_limit_bytes()
            agent_config.disk_free_min_bytes()
        except agent_config.SettingError as exc:
            raise Refused(str(exc)) from None
        os.environ[host.RUNNER_DIR_ENV] = str(config.directory)
        reply = self._approved(config)
        queues = reply["queues"]
        # An older server says nothing: results go to the control queue.
        ingest = reply.get("ingest") or protocol.CONTROL
        if not protocol.ingest_queue_valid(ingest):
            raise Refused(
                f"the server named {ingest!r} as this runner's results queue; "
                "expected control or ingest.N"
            )
        app.conf[protocol.INGEST_QUEUE] = ingest
        if reply.get("broker"):
            try:
                broker_login.app_isolate(
                    app,
                    runner_name=config.name,
                    queues=queues,
                    login=reply["broker"],
                    base_url=os.environ.get("CELERY_BROKER_URL"),
                )
            except broker_login.LoginUnusable as exc:
                raise Refused(str(exc)) from None
            self.say(
                f"runner {config.name} connects as broker user "
                f"{reply['broker']['username']}, limited to its own queues"
            )
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
                # Worker heartbeats are events on the shared celeryev
                # exchange, which no monitor here reads and a runner's own
                # broker user may not publish to; the runner's signed
                # heartbeats go to the control queue.
                "--without-heartbeat",
            ]
        )

    def do_execute_bundle(self, *, jobs, out, key_dir, **_):
        output = OutputFile(out)
        config = self._config(key_dir)
        bundle = read_json(jobs)
        envelopes = bundle.get("jobs") if isinstance(bundle, dict) else None
        if not isinstance(envelopes, list):
            raise Refused(f'{jobs} is not a jobs bundle ({{"jobs": [...]}})')
        if not envelopes:
            raise Refused(f"{jobs} holds no jobs: nothing to run; {out} not written")
        results, skipped = host.bundle_execute(envelopes=envelopes, config=config)
        for reason in skipped:
            self.warn(f"skipped {reason}")
        if not results:
            # Not written: an empty results file is one `runner upload`
            # refuses, and writing it would replace the results of an
            # earlier run at that path not yet uploaded.
            raise Refused(
                f"every one of the {len(skipped)} messages in {jobs} was skipped "
                f"(reasons above): no job ran; {out} not written"
            )
        for i, signed in enumerate(results, start=1):
            status = signed["payload"]["result"].get("status")
            self.say(f"[{i}/{len(results)}] job {signed['payload']['job']}: {status}")
        output.write(json.dumps({"results": results}) + "\n")
        self.say(
            f"{len(results)} signed results in {out}; {len(skipped)} messages skipped"
        )
        if skipped:
            sys.exit(1)

    def do_upload(self, *, results, server, key_dir, **_):
        server = server_url(server or self._config(key_dir).server)
        bundle = read_json(results)
        envelopes = bundle.get("results") if isinstance(bundle, dict) else None
        if not isinstance(envelopes, list) or not envelopes:
            raise Refused(f'{results} is not a results bundle ({{"results": [...]}})')
        batches = client.upload_batches(envelopes)
        stored = duplicate = 0
        refused = []

        def batch_failed(number: int, batch: range, why: str) -> Refused:
            # What the batches before it stored stays stored: sending the
            # file again counts those as already stored.
            before = (
                f"; the batches before it: {stored} stored, {duplicate} already "
                f"stored, {len(refused)} refused"
                if number > 1
                else ""
            )
            return Refused(
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
                    number, batch, f" refused ({status}): {client.problem(reply)}"
                )
            stored += reply["stored"]
            duplicate += reply["duplicate"]
            # The server counts within the batch; the file's index is wanted.
            refused += [
                (batch.start + r["index"], r["reason"]) for r in reply["refused"]
            ]
        self.say(f"{stored} stored, {duplicate} already stored, {len(refused)} refused")
        for index, reason in refused:
            self.warn(f"  result {index}: {reason}")
        if refused:
            sys.exit(1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="tilematrix-runner", description=__doc__.split("\n\n")[0]
    )
    sub = parser.add_subparsers(dest="action", required=True)
    host_arguments_add(sub)
    options = vars(parser.parse_args(argv))
    action = options.pop("action")
    try:
        HostCommands().run(action, options)
    except Refused as exc:
        sys.stderr.write(f"tilematrix-runner {action}: {exc}\n")
        return 1
    return 0
