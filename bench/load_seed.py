"""A realistic TileMatrix database for bench/load.py, seeded once per size.

The catalogue is what a team serving three model families meets: 15 device
types over five backends, the kernel library's operators with three older
revisions each, 2,672 shapes of which 616 are served (from the built-in
model profiles at more token counts), 12 toolchains (ten older releases,
the current one and an upgrade candidate; the upgrade to the current one
rolled out, its manifest a row per served cell). Results grow the matrix as they
do in use: 0.377 cells per result, spread over the toolchains, each cell
with its history (a few cells re-run hundreds of times), and every result
carries what ingest stores: a real generated kernel source (the library
kernels lowered once for cuda, hip, metal and c, about 5 KB each) and its
error message, each stored once per text (``Blob``), its tolerance, target
and fingerprint components, a receipt signed by a runner, a job. On top: open jobs and one upgrade proposal (the current
toolchain to the candidate on every device type), opened through the gate's
own service.

Rows go in with COPY. Columns come from the models' metadata: a column the
seed does not know gets its field's default, so the seed keeps working as
the schema grows (a new column without a default stops it with its name).

The seeded database is a template (``h_bench_seed_<size>``); each bench run
works on a fresh copy of it, so runs start from the same data.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import secrets
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

sys.path.insert(0, str(Path(__file__).resolve().parent))

from load_catalogue import (  # noqa: E402
    CANDIDATE,
    CURRENT,
    DAYS,
    RELEASES,
    catalogue,
    kernel_sources,
)

ROOT = Path(__file__).resolve().parent.parent
# 4: kernel sources and error messages in blobs (matrix/models/blobs.py).
SEED_VERSION = 4
SIZES = {"10k": 10_000, "100k": 100_000, "1m": 1_000_000, "10m": 10_000_000}
DEFAULT_SERVER = "postgres://postgres@127.0.0.1:5432/"
CELLS_PER_RESULT = 377_000 / 1_000_000
# Outcome shares of a cell's latest result, per backend: CUDA hosts validate,
# ROCm and Metal columns are partly compile-only, the NPU has no kernels yet.
STATUS_MIX = {
    "cuda": [("pass", 70), ("compile_error", 8), ("mismatch", 5), ("runtime_error", 3),
             ("timeout", 2), ("unsupported", 8), ("infra_error", 1), ("built", 3)],
    "hip": [("pass", 35), ("lowered", 20), ("built", 15), ("compile_error", 14),
            ("mismatch", 4), ("runtime_error", 2), ("unsupported", 9), ("timeout", 1)],
    "metal": [("lowered", 45), ("compile_error", 15), ("unsupported", 40)],
    "c": [("pass", 60), ("compile_error", 10), ("mismatch", 5), ("unsupported", 20),
          ("timeout", 5)],
    "npu": [("lowered", 10), ("compile_error", 40), ("unsupported", 50)],
}  # fmt: skip
ERROR_TEMPLATES = {
    "compile_error": [
        "tvm.error.InternalError: Traceback (most recent call last):\n"
        '  File "tilelang/engine/lower.py", line {line}, in lower\n'
        '  File "tvm/ir/transform.py", line 238, in __call__\n'
        "InternalError: Check failed: (analyzer->CanProve(extent % vec == 0)) is "
        "false: {op}: vectorize extent {n} is not a multiple of {vec} in pass "
        "tl.LayoutInference ({target}, {dtype})",
        "tvm.error.InternalError: Traceback (most recent call last):\n"
        '  File "tilelang/transform/__init__.py", line {line}\n'
        "InternalError: shared memory of {n} bytes exceeds the device limit of "
        "{vec} bytes in pass tl.LowerTileOp ({target}, {op}, {dtype})",
        "error: ptxas fatal: Unresolved extern function '__nv_{op}_{vec}'\n"
        "ptxas info: compiling entry function 'main_kernel' for '{target}'",
        "hipcc: error: instruction not supported on this GPU: v_mfma_f32_"
        "{vec}x{vec}x{n}{dtype} in {op} ({target})",
    ],
    "mismatch": [
        "mismatch: {n} of {line} elements outside tolerance (rtol 1e-2, atol 1e-2); "
        "max abs error {vec}.5 at index ({n}, 3); output had NaN",
        "mismatch: output left unwritten at {n} elements (poisoned NaN survived)",
    ],
    "runtime_error": [
        "CUDA error: an illegal memory access was encountered (700) in {op} "
        "launch, grid ({n}, {vec}, 1)",
        "hipErrorLaunchFailure: unspecified launch failure in {op}",
    ],
    "timeout": ["the kernel ran past its {n} s budget"],
    "infra_error": ["runner lost the device: nvidia-smi reports it fell off the bus"],
    "unsupported": [
        "{op} supports ['float16', 'bfloat16'], not {dtype}",
        "{op} has no kernel for backend {target}",
        "{op} supports head_dim in [64, 128], not {n}",
    ],
}


def size_of(name: str) -> int:
    try:
        return SIZES[name.lower()]
    except KeyError:
        raise SystemExit(f"unknown size {name!r}; sizes: {', '.join(SIZES)}") from None


def database_url(server: str, name: str) -> str:
    return urlunsplit(urlsplit(server)._replace(path=f"/{name}"))


def admin_connect(server: str):
    import psycopg

    return psycopg.connect(database_url(server, "postgres"), autocommit=True)


# Databases the bench makes are named with this prefix (``BENCH_DB_PREFIX``),
# so that two people benching on one PostgreSQL server keep their own.
DB_PREFIX = os.environ.get("BENCH_DB_PREFIX", "h_bench")


def seed_name(size: str) -> str:
    return f"{DB_PREFIX}_seed_{size.lower()}"


def run_name(size: str) -> str:
    """The fresh copy of the seeded template a bench run works on."""
    return f"{DB_PREFIX}_{size.lower()}"


def seed_marker(server: str, size: str) -> dict | None:
    """What the seeded template holds (its marker row), or None when it is
    missing, half-made or from an older seed."""
    import psycopg

    name = seed_name(size)
    with admin_connect(server) as conn:
        found = conn.execute(
            "SELECT 1 FROM pg_database WHERE datname = %s", [name]
        ).fetchone()
    if not found:
        return None
    with psycopg.connect(database_url(server, name)) as conn:
        try:
            row = conn.execute("SELECT info FROM bench_seed").fetchone()
        except psycopg.errors.UndefinedTable:
            return None
    info = json.loads(row[0]) if row else None
    if not info or info.get("seed_version") != SEED_VERSION:
        return None
    return info


def copy_database(server: str, template: str, name: str) -> float:
    """A fresh copy of ``template`` as ``name``; seconds taken."""
    from psycopg import sql

    started = time.perf_counter()
    with admin_connect(server) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(name)
            )
        )
        # FILE_COPY: a checkpoint and a copy of the files, where the default
        # (WAL_LOG) writes the whole database through the WAL again.
        conn.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {} STRATEGY FILE_COPY").format(
                sql.Identifier(name), sql.Identifier(template)
            )
        )
    return time.perf_counter() - started


# --- COPY by model metadata --------------------------------------------------


def copy_rows(cursor, model, columns: list[str], rows) -> int:
    """COPY ``rows`` (tuples in ``columns`` order; JSON as text) into the
    model's table. Every other concrete column but the primary key gets the
    field's default, so a column added later needs nothing here."""
    from django.db import connection
    from django.db.models import JSONField

    meta = model._meta
    given = [meta.get_field(c) for c in columns]
    given_columns = {f.column for f in given}
    now = datetime.now(UTC)
    extra, extra_values = [], []
    for field in meta.concrete_fields:
        if field.primary_key and field.column not in given_columns:
            continue
        if field.column in given_columns:
            continue
        if field.has_default():
            value = field.get_default()
        elif getattr(field, "auto_now", False) or getattr(field, "auto_now_add", False):
            value = now
        elif field.null:
            value = None
        else:
            raise SystemExit(
                f"{meta.label}.{field.name} has no default: teach "
                "bench/load_seed.py what to store in it"
            )
        if isinstance(field, JSONField):
            value = json.dumps(value)
        else:
            value = field.get_db_prep_save(value, connection)
        extra.append(field.column)
        extra_values.append(value)
    names = ", ".join([f.column for f in given] + extra)
    tail = tuple(extra_values)
    count = 0
    with cursor.copy(f"COPY {meta.db_table} ({names}) FROM STDIN") as copy:
        for row in rows:
            copy.write_row(row + tail)
            count += 1
    return count


def sequence_reset(cursor, model) -> None:
    table = model._meta.db_table
    cursor.execute(
        f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), "
        f"(SELECT coalesce(max(id), 1) FROM {table}))"
    )


# --- results -----------------------------------------------------------------


def signature_of(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class Outcomes:
    """Statuses, error texts and timings of results, drawn from fixed
    shares; error signatures follow a long tail (a few big groups, many
    small ones) that grows with the matrix."""

    def __init__(self, rng: random.Random, cells: int):
        self.rng = rng
        self.mix = {
            backend: [s for s, w in shares for _ in range(w)]
            for backend, shares in STATUS_MIX.items()
        }
        self.variants = 4 + cells // 4000
        self.texts: dict[tuple, str] = {}  # one string per distinct message

    def status(self, backend: str) -> str:
        return self.rng.choice(self.mix[backend])

    def error(self, status: str, op: str, backend: str, dtype: str) -> str:
        templates = ERROR_TEMPLATES.get(status)
        if not templates:
            return ""
        which = int(self.rng.paretovariate(1.2)) % len(templates)
        variant = int(self.rng.paretovariate(1.0)) % self.variants
        key = (status, which, variant, op, backend, dtype)
        text = self.texts.get(key)
        if text is None:
            text = self.texts[key] = templates[which].format(
                op=op,
                target=backend,
                dtype=dtype,
                n=64 * (1 + variant),
                vec=8 * (1 + variant % 8),
                line=100 + variant,
            )
        return text


def fill(size: int, ids: dict, sources: dict[str, str]) -> dict:
    """COPY jobs, results, receipts and cells for ``size`` results."""
    from django.db import connection

    from matrix.fleet.models import Receipt
    from matrix.models import (
        Blob,
        Cell,
        DeviceType,
        KernelRevision,
        Result,
        Shape,
        Toolchain,
        ValidationJob,
    )

    rng = random.Random(size)
    device_types = list(DeviceType.objects.order_by("id"))
    shapes = list(Shape.objects.select_related("operator").order_by("id"))
    by_pk = Toolchain.objects.in_bulk(ids["toolchains"])
    toolchains = [by_pk[pk] for pk in ids["toolchains"]]
    revisions: dict[int, list[int]] = {}
    for rev in KernelRevision.objects.order_by("operator_id", "created_at", "id"):
        revisions.setdefault(rev.operator_id, []).append(rev)
    for op_id, revs in revisions.items():
        current = [r.pk for r in revs if r.is_current]
        revisions[op_id] = [r.pk for r in revs if not r.is_current] + current

    pairs = [(s, d) for s in shapes for d in device_types]
    # Served shapes and the production backends are run first and most.
    priority = {"cuda": 0.0, "hip": 0.15, "c": 0.25, "metal": 0.3, "npu": 0.4}
    base_key = {
        (s.pk, d.pk): rng.random() * 0.6 + (0.0 if s.served else 0.4)
        + priority[d.backend]
        for s, d in pairs
    }  # fmt: skip
    per_toolchain = min(len(pairs), round(size * CELLS_PER_RESULT / len(RELEASES)))
    cells = []  # (shape, device type, toolchain index)
    for k in range(len(RELEASES)):
        noise = {p: rng.random() * 0.2 for p in base_key}
        ranked = sorted(
            pairs, key=lambda p: base_key[p[0].pk, p[1].pk] + noise[p[0].pk, p[1].pk]
        )
        cells += [(s, d, k) for s, d in ranked[:per_toolchain]]
    # Each cell has one result; the rest is history: a few cells re-run
    # hundreds of times (a flaky kernel under watch), the others a few times,
    # the newer toolchains most.
    counts = [1] * len(cells)
    extra = size - len(cells)
    current_served = [i for i, c in enumerate(cells) if c[2] == CURRENT and c[0].served]
    longest = max(20, size // 2500)
    for i in rng.sample(current_served, min(10, len(current_served))):
        more = min(longest, max(0, extra))
        counts[i] += more
        extra -= more
    weights = [1 + 3 * (c[2] >= CURRENT) for c in cells]
    for i in rng.choices(range(len(cells)), weights=weights, k=max(0, extra)):
        counts[i] += 1

    # The newest result of each cell: its status (the candidate mostly
    # agrees with the baseline) and revision (older toolchains ran older
    # revisions; on the current one a tenth of cells still hold a result of
    # the previous revision, so they read stale).
    outcomes = Outcomes(rng, len(cells))
    newest_status, newest_rev, baseline = {}, {}, {}
    for i, (shape, dt, k) in sorted(enumerate(cells), key=lambda x: x[1][2]):
        revs = revisions[shape.operator_id]
        status = outcomes.status(dt.backend)
        if k == CURRENT:
            baseline[shape.pk, dt.pk] = status
            newest_rev[i] = revs[-2] if rng.random() < 0.1 else revs[-1]
        elif k == CANDIDATE:
            if (shape.pk, dt.pk) in baseline and rng.random() < 0.9:
                status = baseline[shape.pk, dt.pk]
            newest_rev[i] = revs[-1]
        else:
            newest_rev[i] = revs[min(len(revs) - 2, k * (len(revs) - 1) // CURRENT)]
        newest_status[i] = status
    start = datetime.now(UTC) - timedelta(days=DAYS + 1)
    window = timedelta(days=DAYS) / len(RELEASES)
    planned = []  # (time, cell index, revision id, status, error message)
    for i, (shape, dt, k) in enumerate(cells):
        revs = revisions[shape.operator_id]
        begin = start + window * k
        span = window if k < CURRENT else timedelta(days=DAYS) - window * k
        moments = sorted(rng.random() for _ in range(counts[i]))
        for j, m in enumerate(moments):
            if j == len(moments) - 1:
                rev, status = newest_rev[i], newest_status[i]
            else:
                rev, status = rng.choice(revs[:-1]), outcomes.status(dt.backend)
            message = outcomes.error(
                status, shape.operator.name, dt.backend, shape.dtype
            )
            planned.append((begin + span * m, i, rev, status, message))
    planned.sort(key=lambda p: p[0])

    toolchain_ids = [t.pk for t in toolchains]
    fingerprints = {
        t.pk: hashlib.sha256(repr(t.components).encode()).hexdigest()
        for t in toolchains
    }
    stage_of = {"lowered": "lower", "built": "build"}
    tolerance = {
        "float16": {"rtol": 1e-2, "atol": 1e-2, "reason": "fp16 accumulation"},
        "bfloat16": {"rtol": 2e-2, "atol": 2e-2, "reason": "bf16 mantissa"},
        "float32": {"rtol": 1e-5, "atol": 1e-5, "reason": "fp32 reference"},
    }
    details_cache: dict[tuple, str] = {}
    # Each text once, as ingest stores it: the generated sources and every
    # distinct error message, numbered here.
    blob_ids: dict[str, int] = {}
    for text in [*sources.values(), *(p[4] for p in planned)]:
        if text:
            blob_ids.setdefault(text, len(blob_ids) + 1)

    def compiled(status: str) -> bool:
        return status not in ("compile_error", "unsupported", "infra_error")

    def source_id(shape, dt, status: str) -> int | None:
        """The blob of the generated source a result of this kind carries."""
        if not compiled(status):
            return None
        op = shape.operator.name
        text = sources.get(f"{op}/{dt.backend}") or sources.get(f"{op}/c") or ""
        return blob_ids.get(text)

    def details(shape, dt, k: int, status: str) -> str:
        """The details JSON a result of this kind stores, built once per kind."""
        key = (shape.operator_id, dt.pk, shape.dtype, k, compiled(status), status)
        text = details_cache.get(key)
        if text is None:
            value = {
                "target": dt.target,
                "stage": stage_of.get(status, "validate"),
                "seed": 0,
                "fingerprint_components": toolchains[k].components,
            }
            if compiled(status):
                value["tolerance"] = tolerance[shape.dtype]
            text = details_cache[key] = json.dumps(value)
        return text

    job_columns = [
        "id", "revision_id", "shape_id", "device_type_id", "toolchain_id", "stage",
        "state", "attempt", "seed", "queue", "runner_id", "created_at", "started_at",
        "finished_at",
    ]  # fmt: skip
    result_columns = [
        "id", "job_id", "attempt", "revision_id", "shape_id", "device_type_id",
        "toolchain_id", "status", "stage_reached", "rel_err", "max_abs_err",
        "mismatch_ratio", "compile_s", "kernel_ms", "reference_ms", "error_signature",
        "source_id", "error_id", "fingerprint", "details", "created_at",
    ]  # fmt: skip
    receipt_columns = [
        "result_id", "runner_id", "nonce", "signature", "issued_at", "received_at",
    ]  # fmt: skip
    runner_of = ids["runners"]
    ran_statuses = ("pass", "mismatch", "runtime_error", "timeout")
    latest: dict[int, tuple] = {}

    def job_rows():
        for n, (when, i, rev, status, _) in enumerate(planned, start=1):
            shape, dt, k = cells[i]
            yield (
                n, rev, shape.pk, dt.pk, toolchain_ids[k],
                stage_of.get(status, "validate"),
                "failed" if status == "infra_error" else "done", 1, 0,
                f"validate.dt{dt.pk}.tc{toolchain_ids[k]}", runner_of[dt.backend],
                when - timedelta(seconds=30), when - timedelta(seconds=20), when,
            )  # fmt: skip

    def result_rows():
        for n, (when, i, rev, status, message) in enumerate(planned, start=1):
            shape, dt, k = cells[i]
            passed = status == "pass"
            ran = status in ran_statuses
            kms = round(0.005 + rng.random() * 3, 4) if ran else None
            rms = round(kms * (0.8 + rng.random() * 0.5), 4) if ran else None
            signature = signature_of(message) if message else ""
            latest[i] = (n, rev, status, signature, kms, rms, when)
            yield (
                n, n, 1, rev, shape.pk, dt.pk, toolchain_ids[k], status,
                "validate" if ran else stage_of.get(status, "lower"),
                1e-4 * rng.random() if passed else None,
                1e-3 * rng.random() if passed else None,
                0.0 if passed else None, round(0.5 + rng.random() * 20, 3),
                kms, rms, signature, source_id(shape, dt, status),
                blob_ids.get(message), fingerprints[toolchain_ids[k]],
                details(shape, dt, k, status), when,
            )  # fmt: skip

    def receipt_rows():
        for n, (when, i, *_) in enumerate(planned, start=1):
            yield (
                n, runner_of[cells[i][1].backend],
                f"{n:016x}{rng.getrandbits(64):016x}", secrets.token_hex(64),
                when.isoformat()[:40], when,
            )  # fmt: skip

    started = time.perf_counter()
    raw = connection.connection
    # Each table after those it refers to.
    with raw.cursor() as cursor:
        cursor.execute("SET synchronous_commit = off")
        copy_rows(
            cursor,
            Blob,
            ["id", "sha256", "text"],
            (
                (n, hashlib.sha256(text.encode()).hexdigest(), text)
                for text, n in blob_ids.items()
            ),
        )
        copy_rows(cursor, ValidationJob, job_columns, job_rows())
        copy_rows(cursor, Result, result_columns, result_rows())
        copy_rows(cursor, Receipt, receipt_columns, receipt_rows())
        cell_rows = []
        for i, (n, rev, status, signature, kms, rms, when) in latest.items():
            shape, dt, k = cells[i]
            cell_rows.append(
                (
                    shape.pk, dt.pk, toolchain_ids[k], rev, n, status, signature,
                    kms, rms, when,
                )
            )  # fmt: skip
        cell_columns = [
            "shape_id", "device_type_id", "toolchain_id", "revision_id", "result_id",
            "status", "error_signature", "kernel_ms", "reference_ms", "updated_at",
        ]  # fmt: skip
        copy_rows(cursor, Cell, cell_columns, cell_rows)
        for model in (Blob, ValidationJob, Result, Receipt, Cell):
            sequence_reset(cursor, model)
    raw.commit()
    return {
        "results": len(planned),
        "cells": len(latest),
        "cells_per_toolchain": per_toolchain,
        "longest_history": max(counts),
        "error_signatures": len({signature_of(p[4]) for p in planned if p[4]}),
        "blobs": len(blob_ids),
        "copy_s": round(time.perf_counter() - started, 1),
    }


def rolled_out(ids: dict) -> dict:
    """The upgrade that made the current toolchain current, rolled out: its
    manifest holds a row per served cell it covered (TileLang where the
    cell passed), as production reads it."""
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.utils import timezone

    from matrix.gate.manifest import declared_order
    from matrix.models import Cell, DeviceType
    from matrix.models.gate import ManifestEntry, Policy, UpgradeProposal

    previous, current = ids["toolchains"][CURRENT - 1], ids["toolchains"][CURRENT]
    device_types = DeviceType.objects.exclude(backend="npu")
    now = timezone.now()
    upgrade = UpgradeProposal.objects.create(
        baseline_id=previous,
        candidate_id=current,
        proposer=get_user_model().objects.get(username="bench-proposer"),
        note="bench: the upgrade to the current release",
        state=UpgradeProposal.State.ROLLED_OUT,
        policy=Policy.current(),
        approved_at=now - timedelta(days=2),
        rolled_out_at=now - timedelta(days=1),
        evaluated_at=now - timedelta(days=2),
    )
    upgrade.device_types.set(device_types)
    cells = Cell.objects.filter(
        toolchain_id=current, shape__served=True, device_type__in=device_types
    ).values_list(
        "device_type_id",
        "shape_id",
        "shape__operator__name",
        "shape__dtype",
        "shape__dims_key",
        "status",
        "revision__source_sha256",
        "result_id",
    )
    rows = []
    for dt, shape, op, dtype, key, status, sha, result in cells:
        passed = status == "pass"
        rows.append(
            (
                upgrade.pk, current, dt, shape, op, dtype,
                json.dumps(declared_order(key)),
                "tilelang" if passed else "reference",
                "validated: pass" if passed else f"{status} on the candidate",
                sha, result,
            )
        )  # fmt: skip
    columns = [
        "proposal_id", "toolchain_id", "device_type_id", "shape_id", "operator",
        "dtype", "dims", "choice", "reason", "revision_sha256", "result_id",
    ]  # fmt: skip
    with connection.connection.cursor() as cursor:
        copy_rows(cursor, ManifestEntry, columns, rows)
    return {"manifest_entries": len(rows)}


def proposal(ids: dict) -> dict:
    """One upgrade proposal, current toolchain to the candidate on every
    device type but the NPU (whose runner is offline), opened through the
    gate's service (which plans the served cells it lacks: the open jobs of
    a collecting proposal)."""
    from django.contrib.auth import get_user_model

    from matrix.gate.services import proposal_open
    from matrix.models import DeviceType, Toolchain, ValidationJob

    toolchains = Toolchain.objects.in_bulk(ids["toolchains"])
    started = time.perf_counter()
    opened = proposal_open(
        baseline=toolchains[ids["toolchains"][CURRENT]],
        candidate=toolchains[ids["toolchains"][CANDIDATE]],
        device_types=DeviceType.objects.exclude(backend="npu"),
        by=get_user_model().objects.get(username="bench-proposer"),
        note="bench: the candidate release on every device type",
    )
    return {
        "proposal": opened.pk,
        "proposal_state": opened.state,
        "proposal_open_s": round(time.perf_counter() - started, 1),
        "open_jobs": ValidationJob.objects.open().count(),
    }


def seed(server: str, size_name: str) -> dict:
    """Create and fill ``h_bench_seed_<size>``; returns what it holds. Run in
    a process of its own (it configures Django for that database)."""
    from psycopg import sql

    size = size_of(size_name)
    name = seed_name(size_name)
    started = time.perf_counter()
    sources = kernel_sources()
    with admin_connect(server) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(name)
            )
        )
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    django_setup(database_url(server, name))
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", verbosity=0)
    ids = catalogue(random.Random(7))
    say(f"{size_name}: catalogue in {time.perf_counter() - started:.0f} s")
    info = {"seed_version": SEED_VERSION, "size": size_name}
    info.update(fill(size, ids, sources))
    say(f"{size_name}: {info['results']:,} results copied in {info['copy_s']} s")
    info.update(rolled_out(ids))
    info.update(proposal(ids))
    say(f"{size_name}: proposal opened in {info['proposal_open_s']} s")
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")
        cursor.execute("CHECKPOINT")
        info["database_bytes"] = database_bytes(cursor)
        info["storage_bytes"] = storage_bytes(cursor)
        info["seed_s"] = round(time.perf_counter() - started, 1)
        cursor.execute("CREATE TABLE bench_seed (info text)")
        cursor.execute("INSERT INTO bench_seed VALUES (%s)", [json.dumps(info)])
    connection.close()
    return info


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def database_bytes(cursor) -> int:
    cursor.execute("SELECT pg_database_size(current_database())")
    return cursor.fetchone()[0]


def storage_bytes(cursor) -> dict:
    """Where the results' bytes are: the results table (its rows, their
    TOAST, its indexes) and the blob table (texts stored once), whole."""
    cursor.execute(
        """
        SELECT pg_relation_size(c.oid), pg_total_relation_size(c.reltoastrelid),
               pg_indexes_size(c.oid), pg_total_relation_size(c.oid),
               pg_total_relation_size('matrix_blob')
        FROM pg_class c WHERE c.oid = 'matrix_result'::regclass
        """
    )
    names = ("result_heap", "result_toast", "result_indexes", "result_total", "blob")
    return dict(zip(names, cursor.fetchone(), strict=True))


def django_setup(url: str) -> None:
    """Django against ``url`` with production settings, from this process."""
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "matrix.settings")
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()


def main() -> None:
    """``python bench/load_seed.py SIZE [SERVER]``: seed one template (the
    load bench runs this in a child process when a template is missing)."""
    size = sys.argv[1]
    server = sys.argv[2] if len(sys.argv) > 2 else DEFAULT_SERVER
    info = seed(server, size)
    print("SEEDED " + json.dumps(info))


def seed_in_child(server: str, size: str, env: dict) -> dict:
    """Seed in a child process (at nice 10: it is heavy on a shared host)."""
    run = subprocess.run(
        ["nice", "-n", "10", sys.executable, __file__, size, server],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    line = next((x for x in run.stdout.splitlines() if x.startswith("SEEDED ")), None)
    if run.returncode != 0 or line is None:
        raise SystemExit(
            f"seeding {size} failed (exit {run.returncode}):\n{run.stdout[-3000:]}"
        )
    return json.loads(line.removeprefix("SEEDED "))


if __name__ == "__main__":
    main()
