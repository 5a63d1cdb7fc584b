"""Fixtures: one user per role, a real object for every URL argument, and
the page tests' catalogue with results."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group

from matrix.accounts.roles import ADMIN, KERNEL_AUTHOR, REVIEWER, RUNNER_ADMIN, VIEWER
from matrix.fleet.models import Runner
from matrix.gate import services as gate
from matrix.models import (
    Alert,
    Bisection,
    DeviceType,
    Operator,
    Result,
    Shape,
    Subscription,
    Sweep,
    ValidationJob,
)
from matrix.services import toolchain_register
from matrix.submissions import kernel_submit
from tests.security.helpers import PERSONAS, SUPERUSER, attack_source
from tests.ui.conftest import (  # noqa: F401
    device_types,
    toolchains,
    ui_catalog,
)


@pytest.fixture
def people(db, django_user_model):
    users = {}
    for persona in PERSONAS[1:]:
        name = persona.replace(" ", "-")
        if persona == SUPERUSER:
            user = django_user_model.objects.create_superuser(name, password="x")
        else:
            user = django_user_model.objects.create_user(name, password="x")
        if persona in (VIEWER, KERNEL_AUTHOR, REVIEWER, RUNNER_ADMIN, ADMIN):
            user.groups.add(Group.objects.get(name=persona))
        users[persona] = user
    return users


@pytest.fixture
def objects(catalog, people):
    """A real object for every URL argument."""
    shape = Shape.objects.filter(dtype="float32").select_related("operator").first()
    device_type = DeviceType.objects.filter(backend="c").first()
    baseline = toolchain_register(
        name="tilelang-0.1.13", components={"tilelang": "0.1.13"}
    )
    candidate = toolchain_register(
        name="tilelang-0.1.99", components={"tilelang": "0.1.99"}
    )
    proposal = gate.proposal_open(
        baseline=baseline,
        candidate=candidate,
        device_types=[device_type],
        by=people[ADMIN],
    )
    exception = gate.exception_grant(
        proposal=proposal, backend="c", reason="noise", by=people[REVIEWER]
    )
    submission = kernel_submit(
        operator=shape.operator,
        source=attack_source("good_add").replace("good_add", "matrix_add"),
        author=people[KERNEL_AUTHOR],
        backends=["c"],
    )
    runner = Runner.objects.create(
        name="perm-host", public_key="cd" * 32, health=Runner.Health.ACTIVE
    )
    pending = Runner.objects.create(name="perm-pending", public_key="ef" * 32)
    sweep = Sweep.objects.create(created_by=people[ADMIN])
    alert = _alert(shape, device_type, baseline)
    subscription = Subscription.objects.create(
        user=people[VIEWER], channel="email", email="v@x.org", topics=["alert"]
    )
    bisection = Bisection.objects.create(
        revision=shape.operator.current_revision("c"),
        shape=shape,
        device_type=device_type,
        last_good=baseline,
        first_bad=candidate,
        direction=Bisection.Direction.REGRESSION,
        state=Bisection.State.NARROWED,
        ladder=[],
    )
    return {
        "alert": alert.pk,
        "alert-triage": alert.pk,
        "alert-bisect": alert.pk,
        "subscription-test": subscription.pk,
        "subscription-stop": subscription.pk,
        "bisection": bisection.pk,
        "bisection_id": bisection.pk,
        "sweep": sweep.pk,
        "runner-health": runner.pk,
        "runner-revoke": runner.pk,
        "runner-approve": pending.pk,
        "runner-refuse": pending.pk,
        "upgrade-exception-sign-off": exception.pk,
        "submission": submission.pk,
        "submission-review": submission.pk,
        "api:kernel_read": submission.pk,
        "api:kernel_review": submission.pk,
        "api:kernel_revert": submission.pk,
        "shape_id": shape.pk,
        "device_type_id": device_type.pk,
        "upgrade": proposal.pk,
        "name": shape.operator.name,
    }


def _alert(shape, device_type, toolchain) -> Alert:
    """An alert of one compile error, as detection leaves it."""
    revision = shape.operator.current_revision(device_type.backend)
    job = ValidationJob.objects.create(
        revision=revision, shape=shape, device_type=device_type, toolchain=toolchain
    )
    result = Result.objects.create(
        job=job,
        attempt=1,
        revision=revision,
        shape=shape,
        device_type=device_type,
        toolchain=toolchain,
        status="compile_error",
    )
    return Alert.objects.create(
        cause="toolchain:perm",
        kind="toolchain",
        status="compile_error",
        toolchain=toolchain,
        revision=revision,
        first_bad_result=result,
    )


# Kernel submissions: an author, a second reviewer and a pending submission
# of elementwise_add for the CPU backend.
GOOD = attack_source("good_add")
APPROVE = {"decision": "approve", "comment": "reviewed", "confirm": "on"}


def _with_role(user, *roles):
    for role in roles:
        user.groups.add(Group.objects.get(name=role))
    return user


@pytest.fixture
def author(owner):
    return _with_role(owner, KERNEL_AUTHOR, VIEWER)


@pytest.fixture
def second_reviewer(reviewer):
    return _with_role(reviewer, REVIEWER)


@pytest.fixture
def add_operator(catalog):
    return Operator.objects.get(name="elementwise_add")


@pytest.fixture
def cpu_cell(add_operator):
    """A (shape, device type, toolchain) cell of elementwise_add."""
    from matrix.services import toolchain_register

    toolchain = toolchain_register(
        name="tilelang-0.1.15", components={"tilelang": "0.1.15"}, current=True
    )
    shape = Shape.objects.filter(operator=add_operator).first()
    return shape, DeviceType.objects.get(backend="c"), toolchain


@pytest.fixture
def pending(author, add_operator):
    return kernel_submit(
        operator=add_operator, source=GOOD, author=author, backends=["c"]
    )
