"""Starting a bisection: what it refuses, what it says of releases no online
runner can test, and a step whose job was lost."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError

from matrix.bisection.services import bisection_start
from matrix.fleet.models import Runner
from matrix.fleet.services.liveness import jobs_lose
from matrix.models import Bisection, Status, ValidationJob
from matrix.services import toolchain_register
from tests.gate.conftest import online_runner


@pytest.fixture
def regression(world):
    """softmax passes on 0.1.13 and fails to compile on 0.1.15."""
    world.record("softmax", world.cpu, world.old, Status.PASS)
    world.record("softmax", world.cpu, world.new, Status.COMPILE_ERROR)
    return world


def start(world, **overrides):
    return bisection_start(
        **{
            "shape": world.shapes["softmax"],
            "device_type": world.cpu,
            "last_good": world.old,
            "first_bad": world.new,
            **overrides,
        }
    )


def test_it_refuses_pairs_it_cannot_place_among_releases(regression):
    world = regression
    rebuilt = toolchain_register(
        name="tilelang-0.1.15-cu128", components={"tilelang": "0.1.15", "cuda": "12.8"}
    )
    local = toolchain_register(name="local", components={"tilelang": "0.1.16.dev3"})
    with pytest.raises(ValidationError, match="no release lies between them"):
        start(world, last_good=rebuilt)
    with pytest.raises(ValidationError, match="0.1.16.dev3, which is not a release"):
        start(world, first_bad=local)
    with pytest.raises(ValidationError, match="are the same"):
        start(world, first_bad=world.old)
    assert not Bisection.objects.exists()


def test_a_release_hosted_only_offline_is_named_with_its_runner(regression):
    world = regression
    middle = toolchain_register(
        name="tilelang-0.1.14", components={"tilelang": "0.1.14"}
    )
    lab = online_runner("lab-a", device_types=[world.cpu], toolchains=[middle])
    lab.go_offline()
    bisection = start(world)
    assert bisection.state == Bisection.State.NARROWED
    assert bisection.needs == [
        "TileLang 0.1.14 (tilelang-0.1.14) is hosted by lab-a, offline now: start "
        "a bisection again once it is online."
    ]
    assert not ValidationJob.objects.filter(toolchain=middle).exists()
    assert "Not tested: TileLang 0.1.14 (tilelang-0.1.14)." in bisection.conclusion


def test_releases_nobody_hosts_name_no_runner_when_none_has_the_device(regression):
    world = regression
    bisection = start(world)
    # 0.1.14 has no toolchain row and no runner has the CPU device type.
    assert bisection.needs[0].startswith(
        f"TileLang 0.1.14 is not hosted by any online runner with {world.cpu}: a "
        f"runner with {world.cpu} would need it (none is registered). Build it "
        "with `scripts/make-toolchain-venv 0.1.14 "
    )
    assert Runner.objects.count() == 0


def test_a_lost_step_is_settled_when_bisect_is_pressed_again(regression):
    world = regression
    middle = toolchain_register(
        name="tilelang-0.1.14", components={"tilelang": "0.1.14"}
    )
    online_runner("lab-a", device_types=[world.cpu], toolchains=[middle])
    bisection = start(world)
    assert bisection.is_running
    job = bisection.steps.get(job__isnull=False).job
    # The reaper ends it with its own infra_error result, sent to no receiver.
    job.state = ValidationJob.State.RUNNING
    job.save()
    jobs_lose(jobs=[job], reason="runner lab-a went silent")

    again = start(world)
    assert again.pk == bisection.pk
    assert again.state == Bisection.State.NARROWED
    assert (
        "No verdict: TileLang 0.1.14 (tilelang-0.1.14) gave infra_error."
        in again.conclusion
    )
