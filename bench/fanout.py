"""Fan-out: plan and enqueue 10,000 jobs with ``sweep_plan`` (the path the
UI's "Run missing" and ``manage.py sweep`` take), against the configured
database and broker kinds in a scratch deployment. Target: <= 3 s.

    .venv/bin/python bench/fanout.py [--jobs 10000] [--out var/bench/fanout.json]
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import timedelta
from pathlib import Path

from _scratch import REPO, scratch_setup, table

TARGET_S = 3.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--out", default=str(REPO / "var" / "bench" / "fanout.json"))
    args = parser.parse_args()
    kinds = scratch_setup()

    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from matrix.models import DeviceType, Toolchain
    from matrix.services import shape_import
    from runners import services, signing

    device_types = DeviceType.objects.count()
    shapes = -(-args.jobs // device_types)
    shape_import(
        rows=[
            ("elementwise_add", {"M": m, "N": 64}, "float32", 0.0)
            for m in range(1, shapes + 1)
        ],
        source_profile="bench",
        served=False,
    )
    key = Ed25519PrivateKey.generate()
    runner = services.runner_register(
        token=services.token_create(expires=timedelta(hours=1)),
        name="bench-cpu",
        public_key=signing.public_key_hex(key),
        inventory={
            "devices": [
                {"vendor": "x86-64", "model": "CPU", "arch": "", "backend": "c"}
            ],
            "toolchains": [
                {
                    "name": "bench-toolchain",
                    "interpreter": "/usr/bin/python3",
                    "components": {"tilelang": "0.1.15", "python": "CPython 3.11"},
                }
            ],
        },
    )
    services.runner_approve(name=runner.name)
    services.runner_heartbeat(
        envelope=services.heartbeat_envelope(
            runner_name=runner.name, sequence=1, state="online", key=key
        )
    )
    toolchain = Toolchain.objects.get()
    signing.server_key()  # made once, not timed: a server has it already

    started = time.perf_counter()
    cells = services.cells_select(operator="elementwise_add", toolchain=toolchain.name)
    cells = [c for c in cells][: args.jobs]
    selected = time.perf_counter()
    sweep = services.sweep_plan(cells=cells, filters={"bench": "fanout"})
    finished = time.perf_counter()

    queued = broker_depth(kinds["broker"])
    plan_s, total_s = finished - selected, finished - started
    report = {
        "database": kinds["database"],
        "broker": kinds["broker"],
        "jobs": sweep.total,
        "messages_on_broker": queued,
        "select_s": round(selected - started, 3),
        "plan_and_enqueue_s": round(plan_s, 3),
        "total_s": round(total_s, 3),
        "jobs_per_s": round(sweep.total / total_s),
        "target_s": TARGET_S,
        "ok": total_s <= TARGET_S
        and queued == len(services.job_chunks(list(sweep.jobs.all()))),
    }
    print(table([tuple(report.values())], tuple(report)))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"written to {args.out}")


def broker_depth(kind: str) -> int:
    from django.conf import settings

    if kind == "redis":
        import redis

        client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
        names = [k for k in client.keys("*") if client.type(k) == b"list"]
        return sum(client.llen(k) for k in names)
    folder = Path(settings.CELERY_BROKER_TRANSPORT_OPTIONS["data_folder_out"])
    return sum(1 for _ in folder.iterdir())


if __name__ == "__main__":
    main()
