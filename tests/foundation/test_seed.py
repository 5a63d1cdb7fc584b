from __future__ import annotations

import pytest
from django.core.management import call_command

from matrix.models import DeviceType, KernelRevision, Operator, Shape

pytestmark = pytest.mark.django_db


def snapshot():
    return (
        sorted(DeviceType.objects.values_list("vendor", "model", "arch", "backend")),
        sorted(Operator.objects.values_list("name", flat=True)),
        sorted(
            KernelRevision.objects.values_list(
                "operator__name", "source_sha256", "is_current"
            )
        ),
        sorted(
            Shape.objects.values_list(
                "operator__name", "dims_key", "dtype", "served", "weight"
            )
        ),
    )


def test_seeding_twice_changes_nothing():
    call_command("seed_demo")
    first = snapshot()
    call_command("seed_demo")
    assert snapshot() == first


def test_the_demo_has_the_four_device_families_and_the_library_operators():
    call_command("seed_demo")
    backends = set(DeviceType.objects.values_list("backend", flat=True))
    assert backends == {"cuda", "hip", "metal", "c"}
    names = set(Operator.objects.values_list("name", flat=True))
    assert {
        "gemm",
        "softmax",
        "rmsnorm",
        "elementwise_add",
        "attention_causal",
    } <= names
    for op in Operator.objects.all():
        assert op.current_revision("c") is not None, op.name


@pytest.mark.parametrize("tokens", [1, 16, 512, 4096])
def test_llama_3_8b_served_shapes_are_seeded_at_each_token_count(tokens):
    call_command("seed_demo")
    served = Shape.objects.served().filter(source_profile="llama-3-8b")
    keys = set(served.values_list("operator__name", "dims_key", "dtype"))
    for dtype in ("float16", "bfloat16"):
        assert ("gemm", f"M={tokens},N=6144,K=4096", dtype) in keys  # fused qkv
        assert ("gemm", f"M={tokens},N=4096,K=14336", dtype) in keys  # down_proj
        assert ("gemm", f"M={tokens},N=128256,K=4096", dtype) in keys  # lm_head
        assert ("rmsnorm", f"M={tokens},N=4096", dtype) in keys
        assert (
            "attention_causal",
            f"B=1,H=32,HKV=8,S={tokens},D=128",
            dtype,
        ) in keys
    rmsnorm = served.get(
        operator__name="rmsnorm", dims_key=f"M={tokens},N=4096", dtype="float16"
    )
    assert rmsnorm.weight == 65  # two per layer and one final, 32 layers


def test_seeding_a_database_never_migrated_says_to_migrate_first(tmp_path):
    """A fresh SQLite file of its own, so the test database stays as it is."""
    import os
    from pathlib import Path

    from tests import forkserver

    repo = Path(__file__).resolve().parents[2]
    env = {
        **{k: v for k, v in os.environ.items() if k != "DATABASE_URL"},
        "TILEMATRIX_VAR_DIR": str(tmp_path),
    }
    done = forkserver.run(["manage.py", "seed_demo"], cwd=repo, env=env, timeout=120)
    assert done.returncode == 1
    assert "run `manage.py migrate` first" in done.stderr
    assert "Traceback" not in done.stderr
