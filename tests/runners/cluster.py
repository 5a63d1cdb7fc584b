"""A whole TileMatrix deployment in subprocesses, for end-to-end tests: its
own database (a SQLite file, or a fresh PostgreSQL database when
DATABASE_URL names a server), its own broker (a filesystem folder, or a Redis
database index), the web server, the control worker with beat, and runner
workers started with `manage.py runner work`. Runner hosts hold no database
credentials: their processes (register, work) get a DATABASE_URL that fails
at the first query, so any database access on the runner side fails loudly.

The test process never touches this database through the ORM (pytest-django
keeps its own); it drives the deployment with management commands and reads
outcomes with plain SQL.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from base64 import b64encode
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

import pytest

from .. import forkserver
from ..deploy import proxy

REPO = Path(__file__).resolve().parents[2]
PY = sys.executable
# Away from the index CI uses; deployments also prefix their keys.
E2E_REDIS_DB = 11
# Nothing listens on port 1: a connection is refused at once.
RABBIT = "amqp://guest:guest@127.0.0.1:5672"
RABBIT_ADMIN = "http://guest:guest@127.0.0.1:15672/"
NO_DATABASE = "postgres://nobody@127.0.0.1:1/none"
RUNNER_ENV = {"DATABASE_URL": NO_DATABASE}
SHOWN_ONCE = re.compile(r"reviewer account: (reviewer\d) / (\S+)  \(shown once\)")


# Per test process: the database a first deployment migrated and seeded.
_TEMPLATES: dict[str, object] = {}
# Per test process: the inventory a real `runner probe` wrote. Every
# deployment's runner hosts are this machine with this interpreter, so one
# probe (a TileLang import in a fresh interpreter, 1.7 s of CPU) stands for
# the dozens of registrations a test process makes.
_INVENTORY: list[Path] = []


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(predicate, *, timeout: float, what: str, every: float = 0.25):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def rabbit_admin(method: str, path: str):
    """RabbitMQ's management API on this machine, as the guest user."""
    request = urllib.request.Request(
        f"http://127.0.0.1:15672/api/{path}",
        method=method,
        headers={"Authorization": "Basic " + b64encode(b"guest:guest").decode()},
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        raw = answer.read()
    return json.loads(raw) if raw else None


def rabbitmq_or_skip() -> None:
    """Skip the test where RabbitMQ's management API does not answer,
    unless the run must have it (CI: TILEMATRIX_REQUIRE_RABBITMQ)."""
    try:
        rabbit_admin("GET", "overview")
    except (OSError, urllib.error.URLError) as exc:
        if os.environ.get("TILEMATRIX_REQUIRE_RABBITMQ"):
            raise
        pytest.skip(f"RabbitMQ's management API is not on 127.0.0.1:15672: {exc}")


def redis_url(base: str | None) -> str:
    parts = urlsplit(base or "redis://127.0.0.1:6379/0")
    return urlunsplit(parts._replace(path=f"/{E2E_REDIS_DB}"))


class Cluster:
    def __init__(
        self,
        *,
        broker: str = "default",
        harness: str = "edge",
        database: str = "default",
        web_host: str = "127.0.0.1",
    ):
        # Not under pytest's 0700 base: a sandboxed harness child runs under
        # a uid of its own and must reach the kernel cache in a host's
        # directory. The database and server key stay owner-only in var/.
        self.root = Path(tempfile.mkdtemp(prefix="tm-cluster-"))
        self.root.chmod(0o711)
        self.var = self.root / "var"
        self.var.mkdir(mode=0o700)
        self.procs: dict[str, subprocess.Popen] = {}
        self.logs: dict[str, Path] = {}
        env = {
            k: v
            for k, v in os.environ.items()
            if k
            not in {"DATABASE_URL", "CELERY_BROKER_URL", "TILEMATRIX_SERVER_KEY_FILE"}
        }
        env.update(
            DJANGO_SETTINGS_MODULE="matrix.settings",
            TILEMATRIX_VAR_DIR=str(self.var),
            # Short, so that what waits for heartbeats (the reaper, results
            # sent again) happens within seconds; not so short that a busy
            # shared machine reads a live runner as silent (three missed).
            TILEMATRIX_HEARTBEAT_S="2",
            TILEMATRIX_REAP_S="1",
            PYTHONUNBUFFERED="1",
            # Suites run side by side on one Redis (CI, other engineers):
            # each deployment keeps to keys of its own.
            TILEMATRIX_BROKER_KEYPREFIX=f"tm-e2e-{uuid.uuid4().hex[:8]}:",
        )
        if harness == "edge":
            env["TILEMATRIX_HARNESS"] = "tests.runners.edge_harness"
        configured = os.environ.get("CELERY_BROKER_URL", "")
        if broker.startswith("redis://"):
            env["CELERY_BROKER_URL"] = broker
        elif broker == "redis" or (
            broker == "default" and configured.startswith("redis")
        ):
            env["CELERY_BROKER_URL"] = redis_url(
                configured if configured.startswith("redis") else None
            )
        # RabbitMQ: a virtual host of this deployment's own, each approved
        # runner on a broker user the server makes for it. Runner hosts are
        # told the broker's address only.
        self.rabbit_vhost = None
        self.runner_broker = {}
        if broker == "rabbitmq":
            self.rabbit_vhost = f"tm-e2e-{uuid.uuid4().hex[:8]}"
            rabbit_admin("PUT", f"vhosts/{self.rabbit_vhost}")
            env["CELERY_BROKER_URL"] = f"{RABBIT}/{self.rabbit_vhost}"
            env["TILEMATRIX_BROKER_ADMIN_URL"] = RABBIT_ADMIN
            self.runner_broker = {"CELERY_BROKER_URL": "amqp://127.0.0.1:5672/"}
        self.pg_admin = None
        self.nginx: proxy.Nginx | None = None
        database_url = os.environ.get("DATABASE_URL", "")
        if database == "default" and database_url.startswith(("postgres", "pgsql")):
            name = f"tm_e2e_{uuid.uuid4().hex[:10]}"
            self.pg_admin = urlunsplit(
                urlsplit(database_url)._replace(path="/postgres")
            )
            self._pg_execute(f'CREATE DATABASE "{name}"')
            self.pg_name = name
            env["DATABASE_URL"] = urlunsplit(
                urlsplit(database_url)._replace(path=f"/{name}")
            )
        self.env = env
        self.port = free_port()
        self.web_host = web_host
        self.server = f"http://127.0.0.1:{self.port}"
        self._database_ensure()

    # Plumbing ---------------------------------------------------------------

    def _database_ensure(self) -> None:
        """Migrated and seeded: the first deployment of this test process
        runs migrate and seed_demo, and keeps what they made as a template
        (the SQLite file with the key it was made under, or a PostgreSQL
        template database); later deployments start from a copy of it."""
        kind = "postgres" if self.pg_admin else "sqlite"
        template = _TEMPLATES.get(kind)
        if template is None:
            self.manage("migrate", "--noinput")
            self.manage("seed_demo")
            if self.pg_admin:
                template = f"tm_e2e_template_{uuid.uuid4().hex[:10]}"
                self._pg_execute(
                    f'CREATE DATABASE "{template}" TEMPLATE "{self.pg_name}"'
                )
                atexit.register(
                    self._pg_execute,
                    f'DROP DATABASE IF EXISTS "{template}" WITH (FORCE)',
                )
            else:
                template = Path(tempfile.mkdtemp(prefix="tm-cluster-template-"))
                for name in ("db.sqlite3", "secret_key"):
                    shutil.copy2(self.var / name, template / name)
                atexit.register(shutil.rmtree, template, True)
            _TEMPLATES[kind] = template
        elif self.pg_admin:
            self._pg_execute(f'DROP DATABASE "{self.pg_name}"')
            self._pg_execute(f'CREATE DATABASE "{self.pg_name}" TEMPLATE "{template}"')
        else:
            for name in ("db.sqlite3", "secret_key"):
                shutil.copy2(template / name, self.var / name)

    def _pg_execute(self, sql: str) -> None:
        import psycopg

        with psycopg.connect(self.pg_admin, autocommit=True) as conn:
            conn.execute(sql)

    def manage(
        self, *args, check=True, timeout=300, prefix: tuple = (), env=None
    ) -> subprocess.CompletedProcess:
        if prefix:
            done = subprocess.run(
                [*prefix, PY, "manage.py", *args],
                cwd=REPO,
                env={**self.env, **(env or {})},
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        else:
            done = forkserver.run(
                ["manage.py", *args],
                cwd=REPO,
                env={**self.env, **(env or {})},
                timeout=timeout,
            )
        if check and done.returncode != 0:
            raise AssertionError(
                f"manage.py {' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
            )
        return done

    def start(
        self, name: str, argv: list[str], env: dict | None = None
    ) -> subprocess.Popen:
        log = self.root / f"{name}.log"
        handle = log.open("ab")
        proc = subprocess.Popen(
            argv,
            cwd=REPO,
            env={**self.env, **(env or {})},
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, to kill it whole
        )
        self.procs[name], self.logs[name] = proc, log
        return proc

    def log(self, name: str) -> str:
        return self.logs[name].read_text(errors="replace")

    def kill(self, name: str, sig=signal.SIGKILL, grace: float = 30) -> None:
        proc = self.procs.pop(name)
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)

    def close(self) -> None:
        # Runners may be blocked retrying a broker that is gone; nothing of
        # theirs needs a clean shutdown once the test has its answer.
        # A control worker still flushing a batch took the whole 30 s of
        # grace at the end of two tests: a few seconds, then SIGKILL.
        for name in list(self.procs):
            sig = signal.SIGKILL if name.startswith("runner:") else signal.SIGTERM
            self.kill(name, sig, grace=5)
        if self.nginx is not None:
            self.nginx.stop()
        if self.pg_admin:
            self._pg_execute(f'DROP DATABASE IF EXISTS "{self.pg_name}" WITH (FORCE)')
        if self.rabbit_vhost:
            for held in rabbit_admin("GET", f"vhosts/{self.rabbit_vhost}/permissions"):
                if held["user"] != "guest":
                    rabbit_admin("DELETE", f"users/{quote(held['user'], safe='')}")
            rabbit_admin("DELETE", f"vhosts/{self.rabbit_vhost}")
        if os.environ.get("KEEP_CLUSTER_LOGS"):
            for n, p in self.logs.items():
                shutil.copy(p, "/tmp/cluster-" + n.replace(":", "-") + ".log")
        shutil.rmtree(self.root, ignore_errors=True)

    # The deployment -------------------------------------------------------

    def start_web(self, *, proxied: bool = False) -> None:
        """The web server: Django's own, or (``proxied``) the documented
        deployment, gunicorn behind nginx with deploy/nginx/tilematrix.conf,
        where ``self.server`` is nginx and ``self.gunicorn`` gunicorn."""
        if proxied:
            self._start_proxied()
        else:
            self.start(
                "web",
                [
                    PY,
                    "manage.py",
                    "runserver",
                    f"{self.web_host}:{self.port}",
                    "--noreload",
                ],
            )

        def up():
            try:
                with urllib.request.urlopen(
                    self.server + "/api/v1/openapi.json", timeout=2
                ):
                    return True
            except OSError:
                return False

        wait_for(up, timeout=90, what="the web server")

    def _start_proxied(self) -> None:
        gunicorn_port = free_port()
        self.gunicorn = f"http://127.0.0.1:{gunicorn_port}"
        # nginx on this host is the proxy the app reads X-Forwarded-For from.
        self.start(
            "web",
            proxy.gunicorn_argv(gunicorn_port),
            env={"TILEMATRIX_TRUSTED_PROXIES": "127.0.0.1"},
        )
        proxy.wait_answering(
            self.gunicorn + "/livez", timeout=90, what="gunicorn (docs/deploy.md)"
        )
        self.nginx = proxy.Nginx(
            listen_port=self.port, upstream_port=gunicorn_port, static=REPO / "static"
        )

    def start_control(self, **env) -> None:
        """``env``: settings of the control worker alone (its mail server)."""
        self.start("control", [PY, "manage.py", "control", "work"], env=env)

    def key_dir(self, runner: str) -> Path:
        path = self.root / "hosts" / runner
        path.mkdir(parents=True, exist_ok=True, mode=0o711)
        (self.root / "hosts").chmod(0o711)
        return path

    def register(
        self, runner: str, server: str | None = None, prefix: tuple = ()
    ) -> str:
        token = (
            self.manage("runner", "token", "create", "--expires", "10m")
            .stdout.strip()
            .splitlines()[-1]
        )
        done = self.manage(
            "runner",
            "register",
            "--server",
            server or self.server,
            "--token",
            token,
            "--name",
            runner,
            "--key-dir",
            str(self.key_dir(runner)),
            "--inventory",
            str(self.inventory()),
            prefix=prefix,
            env=RUNNER_ENV,
        )
        # The runner admin approves what it claims, as on the Runners page.
        self.manage("runner", "approve", runner)
        return done.stdout

    def inventory(self) -> Path:
        """This host's inventory, probed once per test process."""
        if not _INVENTORY:
            folder = Path(tempfile.mkdtemp(prefix="tm-inventory-"))
            atexit.register(shutil.rmtree, folder, True)
            path = folder / "inventory.json"
            self.manage("runner", "probe", "--out", str(path), env=RUNNER_ENV)
            _INVENTORY.append(path)
        return _INVENTORY[0]

    def start_runner(self, runner: str, prefix: tuple = (), **env) -> None:
        """``prefix`` runs it elsewhere, e.g. ("ip", "netns", "exec", NAME)."""
        self.start(
            f"runner:{runner}",
            [
                *prefix,
                PY,
                "-m",
                "runners",  # the runner agent, as a lab host runs it
                "work",
                "--key-dir",
                str(self.key_dir(runner)),
            ],
            env={**RUNNER_ENV, **self.runner_broker, **env},
        )

    def broker_url(self) -> str:
        return self.env.get("CELERY_BROKER_URL", "filesystem://")

    def connection(self):
        """A kombu connection to this deployment's broker, as its processes
        make it (the embedded broker's own transport, its folders)."""
        from kombu import Connection

        from matrix.config import broker_transport

        url = self.broker_url()
        if url.startswith("filesystem"):
            folder = str(self.var / "broker" / "out")
            # kombu's exchange bindings go to ./control unless told otherwise.
            options = {
                "data_folder_in": folder,
                "data_folder_out": folder,
                "control_folder": str(self.var / "broker" / "control"),
            }
        else:
            options = {"global_keyprefix": self.env["TILEMATRIX_BROKER_KEYPREFIX"]}
        return Connection(
            url, transport=broker_transport(url), transport_options=options
        )

    # Reading outcomes -----------------------------------------------------

    def manifest(self, toolchain: str) -> dict:
        """The manifest as production downloads it."""
        with urllib.request.urlopen(
            f"{self.server}/api/v1/manifest?toolchain={toolchain}", timeout=30
        ) as answer:
            return json.load(answer)

    def demo_reviewers(self, *evidence: str) -> dict[str, str]:
        """The demo's reviewer accounts, made by ``demo_upgrade`` (with an
        upgrade for each A/B in ``evidence``): name -> the password it
        prints once."""
        said = self.manage("demo_upgrade", *evidence).stdout
        return dict(SHOWN_ONCE.findall(said))

    def sql(self, query: str, params: tuple = ()) -> list[tuple]:
        if self.pg_admin:
            import psycopg

            with psycopg.connect(self.env["DATABASE_URL"]) as conn:
                return conn.execute(query.replace("?", "%s"), params).fetchall()
        with sqlite3.connect(self.var / "db.sqlite3", timeout=20) as conn:
            return conn.execute(query, params).fetchall()

    def children(self, name: str) -> list[int]:
        """The processes a started process started (a worker's pool, its
        beat)."""
        done = subprocess.run(
            ["pgrep", "-P", str(self.procs[name].pid)], capture_output=True, text=True
        )
        return [int(pid) for pid in done.stdout.split()]

    def runner_state(self, runner: str) -> str | None:
        rows = self.sql("SELECT state FROM runners_runner WHERE name = ?", (runner,))
        return rows[0][0] if rows else None

    def plan(self, code: str) -> int:
        """Plan a sweep with Python run in the deployment (``cells`` and
        ``services`` are in scope); returns its id."""
        script = (
            "from matrix.models import *\n"
            "from matrix.fleet import services\n"
            f"cells = {code}\n"
            "print(services.sweep_plan(cells=cells).pk)\n"
        )
        return int(self.manage("shell", "-c", script).stdout.strip().splitlines()[-1])

    def sweep(self, *args) -> int:
        out = self.manage("sweep", "--no-wait", *args).stdout
        return int(out.split()[1].rstrip(":"))

    def jobs(self, sweep: int) -> list[tuple]:
        return self.sql(
            "SELECT id, state, attempt, runner_id FROM matrix_validationjob WHERE sweep_id = ?",
            (sweep,),
        )

    def results_per_job(self, sweep: int) -> dict[int, int]:
        rows = self.sql(
            "SELECT j.id, COUNT(r.id) FROM matrix_validationjob j "
            "LEFT JOIN matrix_result r ON r.job_id = j.id WHERE j.sweep_id = ? GROUP BY j.id",
            (sweep,),
        )
        return dict(rows)

    def wait(self, predicate, *, timeout: float, what: str):
        """wait_for, with the tail of every process's log when it times out."""
        try:
            return wait_for(predicate, timeout=timeout, what=what)
        except AssertionError as exc:
            tails = "\n".join(f"--- {n}\n{self.log(n)[-2500:]}" for n in self.logs)
            raise AssertionError(f"{exc}\n{tails}") from None

    def finished(self, sweep: int) -> bool:
        jobs = self.jobs(sweep)
        return bool(jobs) and all(
            state in ("done", "failed", "lost") for _, state, _, _ in jobs
        )

    def wait_finished(self, sweep: int, timeout: float = 240) -> None:
        try:
            wait_for(
                lambda: self.finished(sweep),
                timeout=timeout,
                what=f"sweep {sweep}",
                every=0.5,
            )
        except AssertionError:
            states = json.dumps(self.jobs(sweep))
            tails = {n: self.log(n)[-3000:] for n in self.logs}
            raise AssertionError(
                f"sweep {sweep} unfinished: {states}\n{tails}"
            ) from None
