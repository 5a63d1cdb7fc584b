from __future__ import annotations

import pytest

from matrix.fleet import services
from matrix.fleet.models import Runner
from matrix.models import (
    Cell,
    DeviceType,
    JobStage,
    JobState,
    Shape,
    Toolchain,
    ValidationJob,
)

from .conftest import cpu_inventory


def test_cells_a_runner_has_the_device_for_are_validated_on_its_queue(
    cpu_runner, cpu_cells
):
    cells = cpu_cells()
    sweep = services.sweep_plan(cells=cells)
    assert sweep.total == len(cells) == 10
    cpu, toolchain = cells[0][1], cells[0][2]
    assert set(sweep.jobs.values_list("stage", "queue", "state")) == {
        (JobStage.VALIDATE, f"validate.dt{cpu.pk}.tc{toolchain.pk}", JobState.QUEUED)
    }
    assert sweep.progress()["queued"] == 10


def test_cells_with_no_runner_for_the_device_are_lowered_on_the_compile_queue(
    cpu_runner, cpu_cells
):
    h200 = DeviceType.objects.get(model="H200")
    toolchain = Toolchain.objects.get()
    shape = cpu_cells()[0][0]
    sweep = services.sweep_plan(cells=[(shape.pk, h200.pk, toolchain.pk)])
    job = sweep.jobs.get()
    assert (job.stage, job.queue) == (JobStage.LOWER, f"compile.tc{toolchain.pk}")


def test_cuda_cells_are_lowered_unless_builds_are_asked_for(register, cpu_cells):
    inventory = cpu_inventory()
    inventory["nvcc"] = True
    register(inventory=inventory)
    h200 = DeviceType.objects.get(model="H200")
    toolchain = Toolchain.objects.get()
    cell = (cpu_cells()[0][0], h200, toolchain)
    # An nvcc build costs many times a lowering: never the default.
    job = services.sweep_plan(cells=[cell]).jobs.get()
    assert (job.stage, job.queue) == (JobStage.LOWER, f"compile.tc{toolchain.pk}")
    ValidationJob.objects.update(state=JobState.DONE)
    job = services.sweep_plan(cells=[cell], build=True).jobs.get()
    assert (job.stage, job.queue) == (JobStage.BUILD, f"compile.tc{toolchain.pk}.nvcc")


def test_builds_asked_for_without_an_nvcc_host_are_lowered(cpu_runner, cpu_cells):
    h200 = DeviceType.objects.get(model="H200")
    toolchain = Toolchain.objects.get()
    cell = (cpu_cells()[0][0], h200, toolchain)
    job = services.sweep_plan(cells=[cell], build=True).jobs.get()
    assert job.stage == JobStage.LOWER


@pytest.mark.parametrize("health", [Runner.Health.MAINTENANCE, Runner.Health.RETIRED])
def test_nothing_is_routed_to_a_runner_out_of_service(
    cpu_runner, cpu_cells, admin_user, health
):
    cpu_runner.runner.set_health(health, by=admin_user)
    job = services.sweep_plan(cells=cpu_cells()[:1]).jobs.get()
    assert job.stage == JobStage.LOWER


def test_an_offline_runner_gets_no_validation_work(register, cpu_cells):
    register(online=False)
    job = services.sweep_plan(cells=cpu_cells()[:1]).jobs.get()
    assert job.stage == JobStage.LOWER


def test_cells_with_an_open_job_are_skipped(cpu_runner, cpu_cells):
    cells = cpu_cells()
    services.sweep_plan(cells=cells[:3])
    again = services.sweep_plan(cells=cells)
    assert again.total == len(cells) - 3
    assert ValidationJob.objects.count() == len(cells)


def test_the_sweep_records_who_asked_and_the_filters(cpu_runner, cpu_cells, owner):
    sweep = services.sweep_plan(
        cells=cpu_cells(), created_by=owner, filters={"operator": "softmax"}
    )
    assert sweep.created_by == owner
    assert sweep.filters == {"operator": "softmax"}


def test_jobs_are_enqueued_only_when_the_plan_commits(
    cpu_runner, cpu_cells, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks() as callbacks:
        services.sweep_plan(cells=cpu_cells())
    assert len(callbacks) == 1


def test_cells_select_filters_by_operator_device_and_missing(cpu_runner, running_job):
    cells = services.cells_select(operator="softmax", device_type="c")
    shapes = Shape.objects.filter(pk__in=[s for s, _, _ in cells])
    assert cells and set(shapes.values_list("operator__name", flat=True)) == {"softmax"}
    assert {d for _, d, _ in cells} == {running_job.device_type_id}
    Cell.objects.create(
        shape=running_job.shape,
        device_type=running_job.device_type,
        toolchain=running_job.toolchain,
        revision=running_job.revision,
        result=running_job.results.create(
            attempt=1,
            revision=running_job.revision,
            shape=running_job.shape,
            device_type=running_job.device_type,
            toolchain=running_job.toolchain,
            status="pass",
        ),
        status="pass",
        updated_at=running_job.created_at,
    )
    everything = services.cells_select(device_type="c")
    missing = services.cells_select(device_type="c", missing_only=True)
    assert len(everything) - len(missing) == 1
    served = services.cells_select(device_type="c", served_only=True)
    assert served and len(served) < len(everything)


def test_each_message_carries_its_jobs_as_their_rows_read(
    cpu_runner, cpu_cells, monkeypatch
):
    """The planner builds payloads from rows, not model instances: they say
    what job_payload says of the stored job, a reviewed submission's source
    included."""
    import hashlib

    from matrix.fleet.services import planning
    from matrix.models import KernelRevision
    from matrix.revisions import make_current

    source = "def program(shape, dtype, target):\n    return None\n"
    softmax = KernelRevision.objects.get(operator__name="softmax", is_current=True)
    submitted = KernelRevision.objects.create(
        operator=softmax.operator,
        source=source,
        source_sha256=hashlib.sha256(source.encode()).hexdigest(),
        origin=KernelRevision.Origin.SUBMITTED,
        review_state=KernelRevision.Review.APPROVED,
        backends=["c"],
    )
    make_current(submitted, ["c"])
    sent = []
    monkeypatch.setattr(planning, "_messages_publish", sent.extend)
    sweep = services.sweep_plan(cells=cpu_cells())
    jobs = sweep.jobs.order_by("pk")
    payloads = sorted((p for _, chunk in sent for p in chunk), key=lambda p: p["job"])
    assert payloads == [services.job_payload(job) for job in jobs]
    assert any(p.get("source") == source for p in payloads)
    assert {queue for queue, _ in sent} == {job.queue for job in jobs}
