from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.core.exceptions import PermissionDenied, ValidationError
from django.utils import timezone

from matrix.fleet import services
from matrix.fleet.models import RegistrationToken, Runner, token_digest
from matrix.models import AuditEvent, DeviceType, Toolchain
from runners import signing

from .conftest import cpu_inventory


def public_key():
    return signing.public_key_hex(Ed25519PrivateKey.generate())


def register(token, name="cpu-1", inventory=None, key=None):
    return services.runner_register(
        token=token,
        name=name,
        public_key=key or public_key(),
        inventory=inventory or cpu_inventory(),
    )


@pytest.fixture
def token(catalog):
    return services.token_create(expires=timedelta(hours=1))


def test_a_token_is_stored_only_as_its_digest(token):
    record = RegistrationToken.objects.get()
    assert token not in record.digest
    assert record.digest == token_digest(token)


def test_registration_matches_the_seeded_cpu_device_type_and_records_the_toolchain(
    token,
):
    runner = register(token)
    cpu = DeviceType.objects.get(backend="c")
    # Recorded when a runner admin approves what it claims, not before.
    assert not runner.device_types.exists() and not runner.toolchains.exists()
    runner = services.runner_approve(name=runner.name)
    assert list(runner.device_types.all()) == [cpu]
    toolchain = runner.toolchains.get()
    assert toolchain.name == "tilelang-0.1.15-cpu"
    assert runner.state == Runner.State.OFFLINE
    assert runner.queues() == [
        "runner.cpu-1",
        f"validate.dt{cpu.pk}.tc{toolchain.pk}",
        f"compile.tc{toolchain.pk}",
    ]
    assert AuditEvent.objects.filter(
        verb="runner.register", object_id=str(runner.pk)
    ).exists()


def test_a_second_host_with_the_same_toolchain_shares_its_row(token):
    services.runner_approve(name=register(token).name)
    again = services.token_create(expires=timedelta(hours=1))
    other = register(again, name="cpu-2", inventory=cpu_inventory(name="whatever-name"))
    services.runner_approve(name=other.name)
    assert Toolchain.objects.count() == 1
    assert other.toolchains.get().name == "tilelang-0.1.15-cpu"


def test_a_new_gpu_device_type_is_created_from_the_inventory(token):
    inventory = cpu_inventory()
    inventory["devices"].append(
        {
            "vendor": "NVIDIA",
            "model": "L4",
            "arch": "sm_89",
            "backend": "cuda",
            "memory_gb": 24,
        }
    )
    runner = register(token, inventory=inventory)
    assert not DeviceType.objects.filter(model="L4").exists()  # until approved
    services.runner_approve(name=runner.name)
    assert runner.device_types.filter(model="L4", arch="sm_89").exists()


def test_it_refuses_a_reused_token(token):
    register(token)
    with pytest.raises(PermissionDenied, match="already used"):
        register(token, name="cpu-2")
    assert Runner.objects.count() == 1


def test_it_refuses_an_expired_token(catalog):
    token = services.token_create(expires=timedelta(hours=1))
    RegistrationToken.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    with pytest.raises(PermissionDenied, match="expired"):
        register(token)
    assert not Runner.objects.exists()


def test_it_refuses_an_unknown_token(catalog):
    with pytest.raises(PermissionDenied, match="unknown registration token"):
        register("not-a-token")


def test_a_duplicate_name_is_refused_and_the_token_stays_usable(token):
    register(token)
    second = services.token_create(expires=timedelta(hours=1))
    with pytest.raises(services.Conflict, match="already registered"):
        register(second)
    assert register(second, name="cpu-2").name == "cpu-2"


def test_a_key_already_registered_under_another_name_is_refused(token):
    key = public_key()
    register(token, key=key)
    second = services.token_create(expires=timedelta(hours=1))
    with pytest.raises(
        services.Conflict, match="this public key is already runner 'cpu-1''s"
    ):
        register(second, name="cpu-2", key=key.upper())
    assert list(Runner.objects.values_list("name", flat=True)) == ["cpu-1"]
    assert register(second, name="cpu-2").name == "cpu-2"


def test_the_key_of_a_revoked_runner_cannot_register_again(token):
    key = public_key()
    register(token, key=key)
    services.runner_revoke(name="cpu-1")
    second = services.token_create(expires=timedelta(hours=1))
    with pytest.raises(services.Conflict, match="'cpu-1''s \\(revoked\\)"):
        register(second, name="cpu-1-again", key=key)


def test_an_oversized_inventory_is_refused_and_nothing_is_created(token):
    inventory = cpu_inventory()
    inventory["host"] = {"notes": "x" * 70_000}
    with pytest.raises(ValidationError, match="limit is 65536"):
        register(token, inventory=inventory)
    assert not Runner.objects.exists()
    assert RegistrationToken.objects.get().used_at is None


@pytest.mark.parametrize(
    "change, reason",
    [
        ({"devices": "cpu"}, "needs lists"),
        ({"toolchains": []}, "no toolchain"),
        (
            {"devices": [{"vendor": "x", "model": "y", "backend": "fpga"}]},
            "backend must be one of",
        ),
        (
            {
                "toolchains": [
                    {
                        "name": "t",
                        "interpreter": "python",
                        "components": {"tilelang": "1"},
                    }
                ]
            },
            "absolute path",
        ),
        (
            {"toolchains": [{"name": "t", "interpreter": "/p", "components": {}}]},
            "at least tilelang",
        ),
        # A new device type's memory goes in an integer column: a huge value
        # was a server error.
        (
            {
                "devices": [
                    {"vendor": "x", "model": "y", "backend": "c", "memory_gb": 10**30}
                ]
            },
            "memory_gb must be a whole number of gigabytes from 0 to 1000000",
        ),
        # A NUL would have made a new matrix column here and a server error
        # on PostgreSQL.
        (
            {
                "devices": [
                    {"vendor": "x", "model": "y", "arch": "sm\x0090", "backend": "c"}
                ]
            },
            "may not contain NUL",
        ),
        ({"host": {"os": "linux\x00"}}, "may not contain NUL"),
    ],
)
def test_a_malformed_inventory_is_refused_with_the_reason(token, change, reason):
    inventory = {**cpu_inventory(), **change}
    with pytest.raises(ValidationError, match=reason):
        register(token, inventory=inventory)
    assert not Runner.objects.exists()
    assert not Toolchain.objects.exists()
    assert not DeviceType.objects.filter(vendor="x").exists()


def test_a_public_key_that_is_not_ed25519_is_refused(token):
    with pytest.raises(ValidationError, match="32-byte Ed25519"):
        register(token, key="abcd")


def test_revoking_a_runner_records_it_and_takes_it_offline(cpu_runner):
    services.runner_revoke(name=cpu_runner.name)
    runner = Runner.objects.get()
    assert runner.revoked_at is not None
    assert runner.state == Runner.State.OFFLINE
    assert not Runner.objects.routable().exists()


@pytest.mark.django_db(transaction=True)
def test_a_key_registered_concurrently_is_a_conflict_not_a_second_runner():
    """The check for a taken key cannot see a registration still in flight:
    the unique column refuses the second insert, and the caller hears who
    holds the key. PostgreSQL only: SQLite has one writer at a time, so a
    second registration cannot be in flight there."""
    from django.db import connection, transaction

    if connection.vendor != "postgresql":
        pytest.skip("needs concurrent writers (PostgreSQL)")
    from matrix.services import catalog_seed

    catalog_seed()
    key = public_key()
    token = services.token_create(expires=timedelta(hours=1))
    inserted = threading.Event()

    def first_registration_still_in_flight():
        with transaction.atomic():
            Runner.objects.create(name="cpu-a", public_key=key)
            inserted.set()
            time.sleep(1.0)  # the second registration's insert waits on this row
        connection.close()

    other = threading.Thread(target=first_registration_still_in_flight)
    other.start()
    assert inserted.wait(10)
    try:
        with pytest.raises(
            services.Conflict, match="this public key is already runner 'cpu-a''s"
        ):
            register(token, name="cpu-b", key=key)
    finally:
        other.join()
    assert list(Runner.objects.values_list("name", flat=True)) == ["cpu-a"]
    # The refused registration used nothing: its token still works.
    assert register(token, name="cpu-b").name == "cpu-b"
