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
