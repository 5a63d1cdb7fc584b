"""`manage.py sweep`: plan jobs for the chosen cells, enqueue them, and show
a progress bar until they finish."""

from __future__ import annotations

import time

from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from matrix.fleet import services
from matrix.fleet.models import Runner
from matrix.gaps import job_durations
from matrix.management.commands._options import not_empty
from matrix.models import Backend, DeviceType, Operator, Toolchain

BAR_WIDTH = 30
FILTERS = ("operator", "device_type", "toolchain", "served_only", "missing_only")


def bar(progress: dict) -> str:
    done = round(BAR_WIDTH * progress["percent"] / 100)
    eta = progress["eta_s"]
    return (
        f"[{'#' * done}{'.' * (BAR_WIDTH - done)}] {progress['percent']:3d}% "
        f"{progress['done']} done, {progress['failed']} failed, "
        f"{progress['running']} running, {progress['queued']} queued"
        + (f", about {eta:.0f} s left" if eta is not None else "")
    )


def filters_check(*, operator=None, device_type=None, toolchain=None, **_) -> None:
    """Refuse a filter value that names nothing here: it would select no
    cell and look like a sweep with nothing left to do."""
    if operator and not Operator.objects.filter(name=operator).exists():
        names = Operator.objects.order_by("name").values_list("name", flat=True)
        raise CommandError(
            f"--operator must be one of {', '.join(names)}; got {operator!r}"
        )
    if device_type:
        known = device_type in Backend.values or (
            DeviceType.objects.named(device_type).exists()
        )
        if not known:
            types = DeviceType.objects.order_by("pk")
            raise CommandError(
                "--device-type takes an id, a backend or part of a model name: "
                + ", ".join(f"{t.pk} ({t})" for t in types)
                + f"; backends {', '.join(Backend.values)}; got {device_type!r}"
            )
    if toolchain and not Toolchain.objects.filter(name=toolchain).exists():
        names = Toolchain.objects.order_by("name").values_list("name", flat=True)
        raise CommandError(
            f"--toolchain must be one of {', '.join(names)}; got {toolchain!r}"
        )


def cells_chosen(**filters) -> list:
    """The cells the filters choose (see services.cells_select), or a
    CommandError for a filter value that names nothing."""
    filters_check(**filters)
    return services.cells_select(**filters)


def nothing_chosen(filters: dict) -> str:
    """Why filters of known values chose no cell."""
    if filters.get("missing_only") and services.cells_select(
        **{**filters, "missing_only": False}
    ):
        return "every cell these filters choose has a result (--missing-only)"
    return (
        "these filters choose no cell (no shape, no device type of that "
        "backend, or no toolchain current or hosted by a runner)"
    )


def jobs_waiting_for_a_runner(sweep) -> int:
    """The sweep's jobs on queues that no online runner consumes."""
    return sweep.jobs.exclude(queue__in=Runner.objects.online().queues_read()).count()


def filter_options_add(parser) -> None:
    """The cell filters a sweep and an offline bundle share."""
    parser.add_argument("--operator", type=not_empty, help="operator name, e.g. gemm")
    parser.add_argument(
        "--device-type", type=not_empty, help="id, backend (c, cuda) or model name"
    )
    parser.add_argument(
        "--toolchain",
        type=not_empty,
        help="toolchain name (default: current and hosted)",
    )
    parser.add_argument("--served-only", action="store_true")
    parser.add_argument(
        "--missing-only", action="store_true", help="cells with no result yet"
    )


def build_refusal(toolchain: str | None) -> str:
    """Why --build cannot be carried out: no online runner with nvcc hosts
    the chosen toolchain (or, without one, any current or hosted one)."""
    capabilities = services.capabilities_online()
    toolchains = Toolchain.objects.filter(pk__in=capabilities.nvcc)
    if toolchain:
        toolchains = toolchains.filter(name=toolchain)
    if toolchains.exists():
        return ""
    where = f" hosts {toolchain}" if toolchain else " is online"
    return f"--build: no runner with nvcc{where}, so no cuda cell can be built"


class Command(BaseCommand):
    help = "Plan and enqueue validation jobs for a set of cells, then wait for them."

    def add_arguments(self, parser):
        filter_options_add(parser)
        parser.add_argument(
            "--build",
            action="store_true",
            help="build cuda cells with nvcc where no online runner has the device "
            "but one with nvcc hosts the toolchain (default: lower them, far "
            "quicker)",
        )
        parser.add_argument(
            "--no-wait", action="store_true", help="return once enqueued"
        )
        parser.add_argument(
            "--timeout", type=float, default=3600, help="seconds to wait"
        )

    def _check_build(self, filters: dict) -> None:
        refusal = build_refusal(filters.get("toolchain"))
        if refusal:
            raise CommandError(refusal + "; leave it out to lower them instead")

    def handle(self, *args, **options):
        # Written so that NaN is refused too: it compares false to anything.
        if not options["timeout"] >= 0:
            raise CommandError(
                f"--timeout takes seconds, 0 or more; got {options['timeout']}"
            )
        filters = {k: options[k] for k in FILTERS if options[k]}
        cells = cells_chosen(**filters)
        if not cells:
            self.stdout.write(f"nothing to plan: {nothing_chosen(filters)}")
            return
        if options["build"]:
            self._check_build(filters)
        with transaction.atomic():
            sweep = services.sweep_plan(
                cells=cells,
                filters={**filters, "build": True} if options["build"] else filters,
                build=options["build"],
            )
            if not sweep.total:
                # An empty sweep would only clutter the sweeps list.
                transaction.set_rollback(True)
        if not sweep.total:
            self.stdout.write(
                f"nothing to plan: each of the {len(cells)} cells chosen has an "
                "open job already, or no approved current revision"
            )
            return
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
        if options["no_wait"]:
            return
        stage_seconds = job_durations().per_stage()
        deadline = time.monotonic() + options["timeout"]
        progress = sweep.progress(stage_seconds=stage_seconds)
        while not progress["finished"]:
            self.stdout.write("\r" + bar(progress), ending="")
            self.stdout.flush()
            if time.monotonic() > deadline:
                self.stdout.write("")
                raise CommandError(
                    f"sweep {sweep.pk} not finished after {options['timeout']:.0f} s"
                )
            time.sleep(1)
            progress = sweep.progress(stage_seconds=stage_seconds)
        self.stdout.write("\r" + bar(progress))
        self.stdout.write(
            f"sweep {sweep.pk} finished: {progress['done']} done, {progress['failed']} failed"
        )
