"""`manage.py sweep`: plan jobs for the chosen cells, enqueue them, and show
a progress bar until they finish."""

from __future__ import annotations

import time

from django.core.management.base import BaseCommand, CommandError

from runners import services
from runners.models import Runner

BAR_WIDTH = 30


def bar(progress: dict) -> str:
    done = round(BAR_WIDTH * progress["percent"] / 100)
    eta = progress["eta_s"]
    return (
        f"[{'#' * done}{'.' * (BAR_WIDTH - done)}] {progress['percent']:3d}% "
        f"{progress['done']} done, {progress['failed']} failed, "
        f"{progress['running']} running, {progress['queued']} queued"
        + (f", about {eta:.0f} s left" if eta is not None else "")
    )


def jobs_waiting_for_a_runner(sweep) -> int:
    """The sweep's jobs on queues that no online runner consumes."""
    read = {q for runner in Runner.objects.online() for q in runner.queues()}
    return sweep.jobs.exclude(queue__in=read).count()


class Command(BaseCommand):
    help = "Plan and enqueue validation jobs for a set of cells, then wait for them."

    def add_arguments(self, parser):
        parser.add_argument("--operator", help="operator name, e.g. gemm")
        parser.add_argument("--device-type", help="id, backend (c, cuda) or model name")
        parser.add_argument(
            "--toolchain", help="toolchain name (default: current and hosted)"
        )
        parser.add_argument("--served-only", action="store_true")
        parser.add_argument(
            "--missing-only", action="store_true", help="cells with no result yet"
        )
        parser.add_argument(
            "--no-wait", action="store_true", help="return once enqueued"
        )
        parser.add_argument(
            "--timeout", type=float, default=3600, help="seconds to wait"
        )

    def handle(self, *args, **options):
        filters = {
            k: options[k]
            for k in (
                "operator",
                "device_type",
                "toolchain",
                "served_only",
                "missing_only",
            )
            if options[k]
        }
        cells = services.cells_select(**filters)
        sweep = services.sweep_plan(cells=cells, filters=filters)
        self.stdout.write(
            f"sweep {sweep.pk}: {sweep.total} jobs planned "
            f"({len(cells) - sweep.total} cells skipped: a job is already open, "
            "or no approved revision)"
        )
        waiting = jobs_waiting_for_a_runner(sweep)
        if waiting:
            self.stderr.write(
                f"{waiting} of them wait on queues no online runner reads (no "
                "runner with their device type or toolchain is online); they run "
                "when one connects"
            )
        if options["no_wait"] or not sweep.total:
            return
        deadline = time.monotonic() + options["timeout"]
        progress = sweep.progress()
        while not progress["finished"]:
            self.stdout.write("\r" + bar(progress), ending="")
            self.stdout.flush()
            if time.monotonic() > deadline:
                self.stdout.write("")
                raise CommandError(
                    f"sweep {sweep.pk} not finished after {options['timeout']:.0f} s"
                )
            time.sleep(1)
            progress = sweep.progress()
        self.stdout.write("\r" + bar(progress))
        self.stdout.write(
            f"sweep {sweep.pk} finished: {progress['done']} done, {progress['failed']} failed"
        )
