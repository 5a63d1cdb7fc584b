"""Ingest over several queues (``matrix/fleet/ingest_queues.py``): which
queue a runner's results take, and which a control worker serves."""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings

from matrix.fleet import ingest_queues
from runners import protocol


def test_one_ingest_queue_is_the_control_queue():
    assert ingest_queues.names() == []
    assert ingest_queues.of_runner("h100-lab-7") == "control"
    assert ingest_queues.served(None) == ["control"]


@override_settings(TILEMATRIX_INGEST_QUEUES=4)
def test_a_fleet_spreads_over_the_queues_and_each_runner_keeps_its_own():
    names = [f"lab{rack}-gpu{slot:02d}" for rack in range(25) for slot in range(40)]
    shares = {queue: 0 for queue in ingest_queues.names()}
    for name in names:
        shares[ingest_queues.of_runner(name)] += 1

    # 1,000 runners over 4 queues: each within 20% of an even 250.
    assert set(shares) == {"ingest.0", "ingest.1", "ingest.2", "ingest.3"}
    assert all(200 <= n <= 300 for n in shares.values()), shares
    # The same name, the same queue: in every process, on every host.
    assert [ingest_queues.of_runner(n) for n in names[:50]] == [
        ingest_queues.of_runner(n) for n in names[:50]
    ]


@override_settings(TILEMATRIX_INGEST_QUEUES=3)
def test_a_control_worker_serves_the_control_queue_and_the_ingest_queues_named():
    assert ingest_queues.served(None) == ["control", "ingest.0", "ingest.1", "ingest.2"]
    assert ingest_queues.served("2, 0,2") == ["control", "ingest.2", "ingest.0"]


@pytest.mark.parametrize(
    ("queues", "shards", "says"),
    [
        (3, "3", "numbers them 0 to 2"),
        (3, "one", "'one' is not an ingest queue"),
        (3, "", "'' is not an ingest queue"),
        (1, "0", "TILEMATRIX_INGEST_QUEUES is 1"),
    ],
)
def test_control_work_refuses_an_ingest_queue_there_is_not(queues, shards, says):
    # Refused before the worker starts: nothing is consumed.
    with override_settings(TILEMATRIX_INGEST_QUEUES=queues):
        with pytest.raises(CommandError, match=says):
            call_command("control", "work", "--ingest", shards)


@pytest.mark.parametrize(
    ("name", "valid"),
    [
        ("control", True),
        ("ingest.0", True),
        ("ingest.63", True),
        ("ingest.", False),
        ("ingest.1.x", False),
        ("runner.other", False),
        ("", False),
        (None, False),
        (7, False),
    ],
)
def test_a_runner_takes_only_a_results_queue_the_server_could_name(name, valid):
    assert protocol.ingest_queue_valid(name) is valid
