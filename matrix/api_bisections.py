"""A bisection over the API: GET /api/v1/bisections/{id}, read as the pages
read it, for a script waiting on its conclusion."""

from __future__ import annotations

from datetime import datetime

from django.http import Http404
from ninja import Router, Schema

from matrix.api_coverage import coverage_reader
from matrix.models import ID_MAX, Bisection

router = Router(tags=["bisections"], auth=coverage_reader)


class CellOut(Schema):
    operator: str
    dims: dict
    dtype: str
    device_type: str
    revision_sha256: str


class RungOut(Schema):
    version: str
    toolchain: str
    hosted: bool
    need: str


class StepOut(Schema):
    number: int
    version: str
    toolchain: str
    status: str
    verdict: str
    reused: bool
    job: int | None
    result: int | None


class BisectionOut(Schema):
    id: int
    state: str
    direction: str
    cell: CellOut
    last_good: str
    first_bad: str
    release: str | None
    conclusion: str
    rungs: list[RungOut]
    steps: list[StepOut]
    repro: dict
    needs: list[str]
    created_at: datetime
    finished_at: datetime | None


class Refused(Schema):
    detail: str


@router.get(
    "/bisections/{bisection_id}",
    response={200: BisectionOut, 403: Refused, 404: Refused},
)
def bisection_read(request, bisection_id: int):
    """A bisection: its releases, steps, and once ended its conclusion, the
    release it names and a repro."""
    found = (
        Bisection.objects.select_related(
            "shape__operator",
            "device_type",
            "revision",
            "last_good",
            "first_bad",
            "release",
        )
        .filter(pk=bisection_id if 0 < bisection_id <= ID_MAX else 0)
        .first()
    )
    if found is None:
        raise Http404("no such bisection")
    steps = found.steps.select_related("toolchain")
    return {
        "id": found.pk,
        "state": found.state,
        "direction": found.direction,
        "cell": {
            "operator": found.shape.operator.name,
            "dims": found.shape.dims,
            "dtype": found.shape.dtype,
            "device_type": str(found.device_type),
            "revision_sha256": found.revision.source_sha256,
        },
        "last_good": found.last_good.name,
        "first_bad": found.first_bad.name,
        "release": found.release.name if found.release else None,
        "conclusion": found.conclusion,
        "rungs": [
            {
                "version": rung["version"],
                "toolchain": rung["name"],
                "hosted": rung["hosted"],
                "need": rung.get("need", ""),
            }
            for rung in found.ladder
        ],
        "steps": [
            {
                "number": step.number,
                "version": step.toolchain.tilelang_version,
                "toolchain": step.toolchain.name,
                "status": step.status,
                "verdict": step.verdict,
                "reused": step.reused,
                "job": step.job_id,
                "result": step.result_id,
            }
            for step in steps
        ],
        "repro": found.repro,
        "needs": found.needs,
        "created_at": found.created_at,
        "finished_at": found.finished_at,
    }
