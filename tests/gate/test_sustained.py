"""Speeds measured at the power cap (`manage.py evidence import-sustained`,
from a `bench/sustained_speed.py` file): the manifest serves the reference
where the harness timed TileLang as faster but the sustained run did not, and
such a file never serves TileLang where the harness said slower."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import CommandError, call_command

from matrix.models.gate import SustainedSpeed
from tests.gate.test_right_and_fast import (
    approve,
    approved_with,
    served,
    softmax_row_on_page,
)


def speed_file(tmp_path, cells, **environment):
    """A sustained-speed file as the bench writes it, on the test world's CPU
    and TileLang 0.1.15; each cell (operator, dims, TileLang ms, reference ms)
    timed in three rounds."""
    data = {
        "environment": {
            "gpu": "x86-64 CPU",
            "target": {"kind": "c"},
            "tilelang": "0.1.15",
            **environment,
        },
        "cells": [
            {
                "op": op,
                "shape": dims,
                "dtype": "float32",
                "status": "pass",
                "runs": [
                    run
                    for n in range(3)
                    for run in (
                        {"impl": "tl", "round": n, "ms": tl},
                        {"impl": "torch", "round": n, "ms": torch},
                    )
                ],
            }
            for op, dims, tl, torch in cells
        ],
    }
    path = tmp_path / "sustained.json"
    path.write_text(json.dumps(data))
    return path


SOFTMAX = {"M": 64, "N": 256}
GEMM = {"M": 64, "N": 64, "K": 64}


def import_sustained(path, **options) -> str:
    out = io.StringIO()
    call_command("evidence", "import-sustained", str(path), stdout=out, **options)
    return out.getvalue()


def test_slower_at_the_power_cap_is_served_the_reference(world, tmp_path, client):
    proposal = approved_with(world, softmax_ms=0.95, softmax_reference_ms=1.0)
    assert "tilelang<br>" in softmax_row_on_page(client, world, proposal)
    out = import_sustained(
        speed_file(
            tmp_path,
            [("softmax", SOFTMAX, 1.0, 0.97), ("gemm", GEMM, 1.0, 1.2)],
        )
    )
    assert "2 speeds kept" in out
    approve(world, proposal)
    assert served(world) == {
        "gemm": (
            "tilelang",
            "validated: pass on tilelang-0.1.15, 1.00× of the reference",
        ),
        "softmax": (
            "reference",
            "pass on tilelang-0.1.15, 1.05× of the reference, but 0.9700× at the "
            "power cap",
        ),
    }
    # The proposal's page says the same for the cell.
    row = softmax_row_on_page(client, world, proposal)
    assert (
        "reference<br><small>pass on tilelang-0.1.15, 1.05× of the reference, but 0.9700× at the power cap"
        in row
    )


def test_faster_at_the_power_cap_never_serves_what_the_harness_found_slower(
    world, tmp_path
):
    proposal = approved_with(world, softmax_ms=1.45, softmax_reference_ms=1.0)
    import_sustained(speed_file(tmp_path, [("softmax", SOFTMAX, 1.0, 1.3)]))
    approve(world, proposal)
    assert served(world)["softmax"] == (
        "reference",
        "pass on tilelang-0.1.15, but 0.69× of the reference",
    )


def test_a_speed_of_another_kernel_revision_is_left_out(world, tmp_path):
    proposal = approved_with(world, softmax_ms=0.95, softmax_reference_ms=1.0)
    path = speed_file(
        tmp_path,
        [("softmax", SOFTMAX, 1.0, 0.5)],
        revisions={"softmax": "0" * 64},
    )
    assert "0 speeds kept" in import_sustained(path)
    assert "1 of another kernel revision" in import_sustained(path)
    approve(world, proposal)
    assert served(world)["softmax"][0] == "tilelang"


def test_a_second_import_replaces_the_speed(world, tmp_path):
    import_sustained(speed_file(tmp_path, [("softmax", SOFTMAX, 1.0, 0.9)]))
    import_sustained(speed_file(tmp_path, [("softmax", SOFTMAX, 1.0, 1.1)]))
    assert [round(s.speed, 3) for s in SustainedSpeed.objects.all()] == [1.1]


@pytest.mark.parametrize(
    ("environment", "why"),
    [
        (
            {"gpu": "NVIDIA B200", "target": {"kind": "cuda", "arch": "sm_100a"}},
            "no device type here is NVIDIA B200",
        ),
        ({"tilelang": "0.2.0"}, "0 toolchains here are TileLang '0.2.0'"),
        ({"target": "c"}, "environment must name the gpu and the target"),
        ({"revisions": ["softmax"]}, "environment.revisions must map"),
        ({"tilelang": ["0.1.15"]}, "must name its TileLang release"),
        ({"target": {"kind": ["c"]}}, "environment must name the gpu and the target"),
    ],
)
def test_a_file_that_names_no_device_or_toolchain_here_is_refused_whole(
    world, tmp_path, environment, why
):
    path = speed_file(tmp_path, [("softmax", SOFTMAX, 1.0, 0.5)], **environment)
    with pytest.raises(CommandError, match=why):
        import_sustained(path)
    assert not SustainedSpeed.objects.exists()


def test_cells_without_a_speed_or_shape_here_are_counted_not_kept(world, tmp_path):
    path = speed_file(
        tmp_path,
        [
            ("softmax", SOFTMAX, -1.0, 1.0),
            ("gemm", GEMM, float("nan"), 1.0),
            ("gemm", {"M": 1, "N": 8, "K": 4096}, 1.0, 1.0),
            ("rmsnorm", {"M": 1, "N": 8}, 1.0, 1.0),
        ],
    )
    out = import_sustained(path, verbosity=2)
    assert "0 speeds kept, 2 cells without one" in out
    assert "2 not in this catalogue" in out
    assert "not here: gemm {'M': 1, 'N': 8, 'K': 4096} float32" in out
    assert not SustainedSpeed.objects.exists()


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("{not json", "is not JSON"),
        ('{"cells": 3}', "not a sustained-speed file"),
        ('{"cells": [], "environment": []}', "has no environment object"),
    ],
)
def test_a_file_that_is_not_a_sustained_run_is_refused(world, tmp_path, text, why):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(CommandError, match=why):
        import_sustained(path)


def test_bad_dims_in_a_cell_name_the_cell(world, tmp_path):
    path = speed_file(tmp_path, [("softmax", {"M": 64}, 1.0, 1.0)])
    with pytest.raises(CommandError, match=r"cells\[0\]: softmax takes dims"):
        import_sustained(path)
