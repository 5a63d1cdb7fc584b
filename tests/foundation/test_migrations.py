"""Migrations that can meet data they refuse say what to fix, by name."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

BEFORE = [("runners", "0003_spentnonce")]
UNIQUE_KEYS = [("runners", "0004_runner_public_key_unique")]


@pytest.mark.django_db(transaction=True)
def test_unique_runner_keys_refuse_a_database_whose_runners_share_one():
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    Runner = executor.loader.project_state(BEFORE).apps.get_model("runners", "Runner")
    for name in ("lab-b", "lab-a"):
        Runner.objects.create(name=name, public_key="ab" * 32)
    Runner.objects.create(name="lab-c", public_key="cd" * 32)

    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    with pytest.raises(
        RuntimeError, match=r"runners share a public key \(lab-a, lab-b\)"
    ):
        executor.migrate(UNIQUE_KEYS)

    # Once one of them is gone, the column becomes unique and nobody is lost.
    Runner.objects.filter(name="lab-b").delete()
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())
    from matrix.fleet.models import Runner as CurrentRunner

    assert sorted(CurrentRunner.objects.values_list("name", flat=True)) == [
        "lab-a",
        "lab-c",
    ]


BEFORE_BLOBS = [("matrix", "0025_policy_rollout_group")]
SOURCE, OTHER_SOURCE = "__global__ void k() { /* a */ }", "void k_c() { /* b */ }"
ERROR, OTHER_ERROR = "error: tile shape does not divide M", "illegal address"


def _sha256(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode()).hexdigest()


def _results_before_blobs(apps) -> list[int]:
    """Results as ingest stored them before texts were shared: the source
    in details (with its hash), the error in its column."""
    Operator = apps.get_model("matrix", "Operator")
    op = Operator.objects.create(name="gemm", dims=["M"])
    revision = apps.get_model("matrix", "KernelRevision").objects.create(
        operator=op, source_sha256="a" * 64, origin="library", review_state="approved"
    )
    shape = apps.get_model("matrix", "Shape").objects.create(
        operator=op, dims={"M": 1}, dims_key="M=1", dtype="float16"
    )
    device_type = apps.get_model("matrix", "DeviceType").objects.create(
        vendor="x86", model="cpu", backend="c"
    )
    toolchain = apps.get_model("matrix", "Toolchain").objects.create(
        name="tl", tilelang_version="0.1.15", fingerprint="b" * 64
    )
    Job = apps.get_model("matrix", "ValidationJob")
    Result = apps.get_model("matrix", "Result")
    rows = [
        ({"kernel_source": SOURCE, "kernel_source_sha256": _sha256(SOURCE)}, ""),
        ({"kernel_source": SOURCE, "tolerance": {"rtol": 0.01}}, ERROR),
        ({"kernel_source": None, "stage": "lower"}, ERROR),
        ({"stage": "lower"}, ""),
        ({"kernel_source": OTHER_SOURCE}, OTHER_ERROR),
    ]
    ids = []
    for details, message in rows:
        job = Job.objects.create(
            revision=revision, shape=shape, device_type=device_type, toolchain=toolchain
        )
        ids.append(
            Result.objects.create(
                job=job,
                attempt=1,
                revision=revision,
                shape=shape,
                device_type=device_type,
                toolchain=toolchain,
                status="pass" if not message else "compile_error",
                details=details,
                error_message=message,
            ).pk
        )
    return ids


@pytest.mark.django_db(transaction=True)
def test_results_texts_move_into_blobs_and_back(monkeypatch):
    import importlib

    moving = importlib.import_module("matrix.migrations.0027_result_texts_to_blobs")
    # Two results a chunk: the move goes chunk by chunk.
    monkeypatch.setattr(moving, "CHUNK", 2)
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE_BLOBS)
    ids = _results_before_blobs(executor.loader.project_state(BEFORE_BLOBS).apps)
    try:
        executor = MigrationExecutor(connection)
        executor.loader.build_graph()
        executor.migrate(executor.loader.graph.leaf_nodes())
        from matrix.models import Blob, Result

        # Each distinct text once.
        assert sorted(Blob.objects.values_list("text", flat=True)) == sorted(
            [SOURCE, OTHER_SOURCE, ERROR, OTHER_ERROR]
        )
        assert all(b.sha256 == _sha256(b.text) for b in Blob.objects.all())
        moved = Result.objects.select_related("source", "error").in_bulk(ids)
        got = [(moved[i].kernel_source, moved[i].error_message) for i in ids]
        assert got == [
            (SOURCE, ""),
            (SOURCE, ERROR),
            ("", ERROR),
            ("", ""),
            (OTHER_SOURCE, OTHER_ERROR),
        ]
        assert moved[ids[0]].source_id == moved[ids[1]].source_id
        assert moved[ids[1]].error_id == moved[ids[2]].error_id
        # What stayed in details stays; the moved keys are gone.
        assert [moved[i].details for i in ids] == [
            {},
            {"tolerance": {"rtol": 0.01}},
            {"stage": "lower"},
            {"stage": "lower"},
            {},
        ]

        # Back: the texts return to their places.
        executor = MigrationExecutor(connection)
        executor.migrate(BEFORE_BLOBS)
        Old = executor.loader.project_state(BEFORE_BLOBS).apps.get_model(
            "matrix", "Result"
        )
        back = Old.objects.in_bulk(ids)
        assert [
            (back[i].details.get("kernel_source"), back[i].error_message) for i in ids
        ] == [
            (SOURCE, ""),
            (SOURCE, ERROR),
            (None, ERROR),
            (None, ""),
            (OTHER_SOURCE, OTHER_ERROR),
        ]
        assert back[ids[1]].details == {
            "kernel_source": SOURCE,
            "kernel_source_sha256": _sha256(SOURCE),
            "tolerance": {"rtol": 0.01},
        }
    finally:
        executor = MigrationExecutor(connection)
        executor.loader.build_graph()
        executor.migrate(executor.loader.graph.leaf_nodes())
