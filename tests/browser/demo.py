"""A TileMatrix web server on the demo's data, in a process of its own.

The database is the one `make run` opens on (the catalogue, the Llama,
Mixtral and Qwen profiles, the H200 lab's signed evidence), plus what the
pages need to show their every part: an admin and two reviewers, a CPU
runner hosting a second toolchain, an upgrade proposal between the two, and
a sweep in progress. Seeding takes about ten seconds, so the browser tests
share one server per session, and ``scripts/screenshots`` draws the
README's screenshots from the same data.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ADMIN = ("demo-admin", "demo-admin-pass-1")
REVIEWERS = (("reviewer-a", "reviewer-pass-1"), ("reviewer-b", "reviewer-pass-2"))
MODELS = ("mixtral-8x7b", "qwen2.5-7b")
EVIDENCE = sorted(
    str(p) for p in (ROOT / "docs" / "evidence").glob("*-h200-*.evidence.json")
)


@dataclass
class Demo:
    url: str
    proposal_id: int
    sweep_id: int


def extra_seed() -> dict:
    """What the demo lacks for the pages to show every part; run inside the
    server's Django by ``manage.py shell``."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group
    from django.utils import timezone

    from matrix.fleet.models import Runner, RunnerToolchain
    from matrix.gate.services import proposal_open
    from matrix.models import DeviceType, Sweep, Toolchain
    from matrix.services import toolchain_register

    User = get_user_model()
    reviewers = []
    for name, password in REVIEWERS:
        user = User.objects.create_user(name, password=password)
        user.groups.add(Group.objects.get(name="reviewer"))
        reviewers.append(user)
    lab = Toolchain.objects.get(is_current=True)
    local = toolchain_register(
        name="tilelang-0.1.15-cpu",
        components={
            "tilelang": "0.1.15",
            "torch": "2.13.0",
            "python": "CPython 3.11",
            "platform": "Linux-x86_64",
        },
    )
    cpu = DeviceType.objects.get(backend="c")
    runner = Runner.objects.create(
        name="cpu-local",
        public_key="ab" * 32,
        state=Runner.State.ONLINE,
        health=Runner.Health.ACTIVE,  # approved by the lab's admin
        last_heartbeat=timezone.now(),
    )
    runner.device_types.set([cpu])
    RunnerToolchain.objects.create(
        runner=runner, toolchain=local, interpreter=sys.executable
    )
    proposal = proposal_open(
        baseline=lab, candidate=local, device_types=[cpu], by=reviewers[0]
    )
    sweep = Sweep.objects.create(total=40, filters={"backend": "c"})
    return {"proposal": proposal.pk, "sweep": sweep.pk}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def seed(roll_out: bool = True) -> dict:
    """Everything `make run` seeds, then ``extra_seed``: in one process, as
    each manage.py start costs seconds. ``roll_out=False`` leaves the
    upgrade undecided, as `make run` opens on it."""
    import io

    from django.core.management import call_command

    out = io.StringIO()
    call_command("migrate", "--noinput", stdout=out)
    call_command("seed_demo", stdout=out)
    for model in MODELS:
        call_command("import_shapes", "--profile", model, stdout=out)
    call_command("evidence", "import", "--current-if-none", *EVIDENCE, stdout=out)
    call_command("ensure_admin", stdout=out)
    call_command("demo_upgrade", *EVIDENCE, stdout=out)
    if roll_out:
        upgrade_roll_out()
    return extra_seed()


def upgrade_roll_out() -> None:
    """The demo's upgrade decided as a newcomer would: both reviewers
    approve and the admin rolls it out, so the pages show the H200 lab's
    current toolchain (0.1.15) with its compile-only columns."""
    from django.contrib.auth import get_user_model

    from matrix.gate.services import proposal_approve, proposal_rollout
    from matrix.models.gate import UpgradeProposal

    User = get_user_model()
    proposal = UpgradeProposal.objects.get()
    for name in ("reviewer1", "reviewer2"):
        proposal_approve(
            proposal=proposal, by=User.objects.get(username=name), comment="ok"
        )
    proposal_rollout(proposal=proposal, by=User.objects.get(username=ADMIN[0]))


SEED = (
    "import json, django; django.setup(); "
    "from tests.browser.demo import seed; print(json.dumps(seed({roll_out})))"
)


def _python(env: dict, code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode != 0:
        raise RuntimeError(f"seeding the demo failed:\n{done.stderr[-3000:]}")
    return done.stdout


@contextmanager
def demo_server(workdir: Path | None = None, *, roll_out: bool = True):
    """Seed a fresh database under ``workdir`` (a temporary one by default),
    serve it, and stop the server on exit. ``roll_out``: see ``seed``."""
    with tempfile.TemporaryDirectory(prefix="tilematrix-demo-") as scratch:
        var = Path(workdir or scratch)
        env = {
            **os.environ,
            "TILEMATRIX_VAR_DIR": str(var),
            "DATABASE_URL": f"sqlite:///{var / 'db.sqlite3'}",
            "DJANGO_DEBUG": "1",
            "DJANGO_SUPERUSER_USERNAME": ADMIN[0],
            "DJANGO_SUPERUSER_PASSWORD": ADMIN[1],
        }
        env.pop("CELERY_BROKER_URL", None)  # the embedded broker, under var
        env["DJANGO_SETTINGS_MODULE"] = "matrix.settings"
        code = SEED.format(roll_out=roll_out)
        seeded = json.loads(_python(env, code).strip().splitlines()[-1])
        port = _free_port()
        server = subprocess.Popen(
            [
                sys.executable,
                "manage.py",
                "runserver",
                f"127.0.0.1:{port}",
                "--noreload",
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=open(var / "server.log", "w"),
        )
        url = f"http://127.0.0.1:{port}"
        try:
            _wait_until_up(url, server)
            yield Demo(url, seeded["proposal"], seeded["sweep"])
        finally:
            server.terminate()
            server.wait(timeout=10)


def _wait_until_up(url: str, server: subprocess.Popen, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"the demo server exited with {server.returncode}")
        try:
            with urllib.request.urlopen(url + "/api/v1/health", timeout=2):
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"the demo server did not answer within {seconds:.0f} s")
