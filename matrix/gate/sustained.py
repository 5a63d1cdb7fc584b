"""Speeds measured at the power cap (``bench/sustained_speed.py``), kept beside
the harness's evidence so that the manifest can serve the reference where a
kernel the harness timed as faster is slower under sustained load.

The harness times a call in one short burst; the sustained run alternates
TileLang and the reference in rounds long enough to reach the device's power
and clock steady state. On the H200 the two disagree by a few percent on
decode gemm calls, in both directions, and where they put a cell on opposite
sides of 1.0x only the sustained figure is what serving meets."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Count, Max

from matrix.models import (
    CurrentRevision,
    DeviceType,
    Shape,
    Toolchain,
    dims_key,
)
from matrix.models.gate import SustainedSpeed


@dataclass
class SustainedImport:
    stored: int = 0
    failed: int = 0  # cells whose kernel did not pass there: no speed
    stale: int = 0  # measured on a revision other than the current one
    unknown: list[str] = field(default_factory=list)  # no such shape here


def _speed(cell: dict) -> float | None:
    """The reference's time over TileLang's, the median over the rounds that
    timed both (as ``bench/sustained_speed.py`` reports it); None where the
    cell has no such round or a time that is not a positive number."""
    rounds: dict = {}
    for run in cell.get("runs") or []:
        if not isinstance(run, dict):
            return None
        ms = run.get("ms")
        if isinstance(ms, bool) or not isinstance(ms, int | float):
            return None
        if not (math.isfinite(ms) and ms > 0):
            return None
        rounds.setdefault(repr(run.get("round")), {})[run.get("impl")] = ms
    ratios = [
        r["torch"] / r["tl"] for r in rounds.values() if {"tl", "torch"} <= set(r)
    ]
    return statistics.median(ratios) if ratios else None


def _device_type(environment: dict) -> DeviceType:
    gpu, target = environment.get("gpu"), environment.get("target")
    if not (
        isinstance(gpu, str)
        and isinstance(target, dict)
        and isinstance(target.get("kind"), str)
        and isinstance(target.get("arch") or "", str)
    ):
        raise ValidationError(
            "environment must name the gpu and the target it ran on "
            '({"gpu": "NVIDIA H200", "target": {"kind": "cuda", "arch": "sm_90a"}})'
        )
    vendor, _, model = gpu.partition(" ")
    found = list(
        DeviceType.objects.filter(
            vendor__iexact=vendor,
            model__iexact=model,
            backend=target.get("kind"),
            arch=target.get("arch") or "",
        )
    )
    if len(found) != 1:
        raise ValidationError(
            f"no device type here is {gpu} {target.get('arch')} {target.get('kind')}"
        )
    return found[0]


def _toolchain(environment: dict, name: str | None) -> Toolchain:
    version = environment.get("tilelang")
    if not isinstance(version, str):
        raise ValidationError("environment must name its TileLang release (tilelang)")
    if name:
        toolchain = Toolchain.objects.filter(name=name).first()
        if toolchain is None:
            raise ValidationError(f"no toolchain named {name!r}")
        if toolchain.tilelang_version != version:
            raise ValidationError(
                f"{name} is TileLang {toolchain.tilelang_version}; the file "
                f"measured {version!r}"
            )
        return toolchain
    found = list(Toolchain.objects.filter(tilelang_version=version))
    if len(found) != 1:
        raise ValidationError(
            f"{len(found)} toolchains here are TileLang {version!r}: name one"
        )
    return found[0]


def sustained_import(
    data, *, source: str, toolchain_name: str | None = None
) -> SustainedImport:
    """Keep each passing cell's speed from a ``bench/sustained_speed.py``
    file, for the operators' current revisions. A file that names the
    revisions it measured (``environment.revisions``) has its cells of any
    other revision left out; an older file names none, and is imported as
    measuring the current ones. A cell already kept is replaced. The whole
    file is refused, with nothing stored, if its device, toolchain or cells
    cannot be read."""
    if not isinstance(data, dict) or not isinstance(data.get("cells"), list):
        raise ValidationError(
            'not a sustained-speed file: expected {"environment": ..., "cells": [...]}'
        )
    environment = data.get("environment")
    if not isinstance(environment, dict):
        raise ValidationError("the file has no environment object")
    named = environment.get("revisions") or {}
    if not isinstance(named, dict):
        raise ValidationError("environment.revisions must map operators to revisions")
    device_type = _device_type(environment)
    toolchain = _toolchain(environment, toolchain_name)
    # The revisions current on the measured device type's backend.
    revisions = {
        c.operator.name: c.revision
        for c in CurrentRevision.objects.filter(
            backend=device_type.backend
        ).select_related("operator", "revision")
    }
    operators = {name: revision.operator for name, revision in revisions.items()}
    outcome, rows = SustainedImport(), []
    for n, cell in enumerate(data["cells"]):
        if not isinstance(cell, dict):
            raise ValidationError(f"cells[{n}] is not an object")
        op = operators.get(cell.get("op"))
        where = f"{cell.get('op')} {cell.get('shape')} {cell.get('dtype')}"
        if op is None:
            outcome.unknown.append(where)
            continue
        measured = named.get(op.name)
        if measured is not None and measured != revisions[op.name].source_sha256:
            outcome.stale += 1
            continue
        try:
            dims = op.clean_dims(cell.get("shape"))
        except ValidationError as exc:
            raise ValidationError(f"cells[{n}]: {'; '.join(exc.messages)}") from None
        dtype = cell.get("dtype")
        shape = None
        if isinstance(dtype, str):
            shape = Shape.objects.filter(
                operator=op, dims_key=dims_key(dims), dtype=dtype
            ).first()
        if shape is None:
            outcome.unknown.append(where)
            continue
        speed = _speed(cell) if cell.get("status") == "pass" else None
        if speed is None:
            outcome.failed += 1
            continue
        rows.append((shape, revisions[op.name], speed))
    with transaction.atomic():
        for shape, revision, speed in rows:
            SustainedSpeed.objects.update_or_create(
                toolchain=toolchain,
                device_type=device_type,
                shape=shape,
                revision=revision,
                defaults={"speed": speed, "source": source[:200]},
            )
    outcome.stored = len(rows)
    return outcome


def sustained_speeds(*, toolchain: Toolchain, device_type_ids=None) -> dict:
    """(shape id, device type id, revision sha256) -> speed at the power cap,
    for one toolchain."""
    rows = SustainedSpeed.objects.filter(toolchain=toolchain)
    if device_type_ids is not None:
        rows = rows.filter(device_type_id__in=device_type_ids)
    return {
        (shape_id, device_type_id, sha): speed
        for shape_id, device_type_id, sha, speed in rows.values_list(
            "shape_id", "device_type_id", "revision__source_sha256", "speed"
        )
    }


def sustained_key(row) -> tuple:
    """A diff row's key in ``sustained_speeds``: its cell and the candidate's
    revision, so a speed measured on another revision does not count."""
    return (row.shape_id, row.device_type_id, row.candidate_revision_sha256)


def sustained_version(*, toolchain_id: int) -> tuple:
    """Changes when speeds of the toolchain are imported again."""
    found = SustainedSpeed.objects.filter(toolchain_id=toolchain_id).aggregate(
        n=Count("id"), last=Max("imported_at")
    )
    return found["n"], found["last"]
