"""The catalogue of bench/load_seed.py's database: device types, the kernel
library's operators with older revisions, served and unserved shapes,
toolchains, runners, and the generated kernel sources results carry (the
library kernels lowered once per backend)."""

from __future__ import annotations

import hashlib
import json
import random
import secrets
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHAPES, SERVED = 2_672, 616
OLD_REVISIONS = 3
DAYS = 360
# Device types beyond the demo catalogue's four (H200, MI300X, M3 Max, CPU).
MORE_DEVICE_TYPES = [
    ("NVIDIA", "H100", "sm_90a", "cuda", 80),
    ("NVIDIA", "A100", "sm_80", "cuda", 80),
    ("NVIDIA", "L40S", "sm_89", "cuda", 48),
    ("NVIDIA", "B200", "sm_100a", "cuda", 192),
    ("NVIDIA", "RTX 4090", "sm_89", "cuda", 24),
    ("AMD", "MI250X", "gfx90a", "hip", 128),
    ("AMD", "MI210", "gfx90a", "hip", 64),
    ("AMD", "Radeon RX 7900 XTX", "gfx1100", "hip", 24),
    ("Apple", "M2 Ultra", "", "metal", 192),
    ("AWS", "Graviton3", "", "c", None),
    ("Huawei", "Ascend 910B", "", "npu", 64),
]
# TileLang releases, oldest first: ten older, the current one, the candidate.
RELEASES = [f"0.1.{n}" for n in range(4, 14)] + ["0.1.15", "0.1.16"]
CURRENT, CANDIDATE = len(RELEASES) - 2, len(RELEASES) - 1
SERVED_TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)


# --- kernel sources ----------------------------------------------------------


def kernel_sources() -> dict[str, str]:
    """``operator/backend`` -> generated device source, from lowering each
    library kernel once per backend (in a harness child, as a runner
    would). Kept under var/bench/ and reused."""
    path = ROOT / "var" / "bench" / "kernel_sources.json"
    if path.exists():
        return json.loads(path.read_text())
    sys.path.insert(0, str(ROOT))
    from runners import kernels
    from runners.harness.sandbox import run_batch

    targets = {
        "cuda": {"kind": "cuda", "arch": "sm_90a"},
        "hip": {"kind": "hip", "mcpu": "gfx942"},
        "metal": {"kind": "metal"},
        "c": {"kind": "c"},
    }
    jobs, keys = [], []
    for name, spec in sorted(kernels.OPERATORS.items()):
        dims = {d: 256 for d in spec.dims}
        dims.update({k: v for k, v in (("B", 1), ("H", 8), ("HKV", 8), ("D", 128))})
        for backend, target in targets.items():
            jobs.append(
                {
                    "operator": name,
                    "shape": {d: dims[d] for d in spec.dims},
                    "dtype": "float16" if backend != "c" else "float32",
                    "target": target,
                    "stage": "lower",
                }
            )
            keys.append(f"{name}/{backend}")
    cache = ROOT / "var" / "bench" / "kernel-cache"
    cache.mkdir(parents=True, exist_ok=True)
    results = run_batch(jobs, cache_dir=str(cache), workers=2)
    sources = {
        key: result["kernel_source"]
        for key, result in zip(keys, results, strict=True)
        if result.get("kernel_source")
    }
    if not sources:
        raise SystemExit("lowering the library kernels produced no source")
    path.write_text(json.dumps(sources, indent=1) + "\n")
    return sources


# --- the catalogue -----------------------------------------------------------


def served_rows(rng: random.Random) -> list[tuple]:
    from matrix import profiles
    from matrix.models import dims_key

    rows, seen = [], set()
    for profile in sorted(profiles.PROFILES):
        for op, dims, dtype, weight in profiles.served_shapes(
            profile, tokens=SERVED_TOKENS
        ):
            key = (op, dims_key(dims), dtype)
            if key not in seen:
                seen.add(key)
                rows.append((op, dims, dtype, weight))
    rng.shuffle(rows)
    return rows


def unserved_dims(spec, i: int, rng: random.Random) -> dict:
    values = {}
    for d in spec.dims:
        if d == "B":
            values[d] = rng.choice((1, 2, 4, 8))
        elif d in ("H", "HKV"):
            values[d] = rng.choice((8, 16, 32))
        elif d == "D":
            values[d] = rng.choice((64, 128))
        else:
            values[d] = rng.choice((1, 7, 33, 64, 100, 128, 512, 1000, 2048)) * (
                1 + i % 16
            )
    if "HKV" in values and "H" in values:
        values["HKV"] = min(values["HKV"], values["H"])
    return values


def catalogue(rng: random.Random) -> dict:
    """Device types, operators with old and current revisions, shapes,
    toolchains, runners, users: through the models (a few hundred rows)."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group

    from matrix.fleet.models import Runner, RunnerToolchain
    from matrix.models import (
        DeviceType,
        KernelRevision,
        Operator,
        Shape,
        Toolchain,
        dims_key,
        fingerprint_of,
    )
    from matrix.services import catalog_seed, shape_import
    from runners import kernels

    catalog_seed()
    for vendor, model, arch, backend, memory in MORE_DEVICE_TYPES:
        DeviceType.objects.get_or_create(
            vendor=vendor,
            model=model,
            arch=arch,
            backend=backend,
            defaults={"memory_gb": memory},
        )
    for op in Operator.objects.all():
        current = op.revisions.get(is_current=True)
        for k in range(OLD_REVISIONS):
            source = current.source + f"\n# tuned tile configuration, round {k}\n"
            KernelRevision.objects.get_or_create(
                operator=op,
                source_sha256=hashlib.sha256(source.encode()).hexdigest(),
                defaults={
                    "source": source,
                    "origin": KernelRevision.Origin.LIBRARY,
                    "review_state": KernelRevision.Review.APPROVED,
                },
            )
    # Served shapes from the model profiles; the rest unserved.
    Shape.objects.update(served=False, weight=0.0)
    served = served_rows(rng)[:SERVED]
    shape_import(rows=served, source_profile="bench-profiles", served=True)
    have = {
        (s.operator.name, s.dims_key, s.dtype)
        for s in Shape.objects.select_related("operator")
    }
    unserved, i = [], 0
    names = sorted(kernels.OPERATORS)
    while len(have) < SHAPES:
        name = names[i % len(names)]
        dims = unserved_dims(kernels.get(name), i, rng)
        dtype = ("float16", "bfloat16", "float32")[i % 3]
        i += 1
        key = (name, dims_key(dims), dtype)
        if key in have:
            continue
        have.add(key)
        unserved.append((name, dims, dtype, 0.0))
    shape_import(rows=unserved, source_profile="bench-unserved", served=False)
    start = datetime.now(UTC) - timedelta(days=DAYS + 5)
    toolchains = []
    for k, release in enumerate(RELEASES):
        components = {
            "tilelang": release,
            "apache-tvm-ffi": f"0.1.{k}",
            "torch": "2.13.0",
            "cuda": "12.8",
            "driver": "570.124",
            "python": "CPython 3.11.11",
        }
        toolchain, _ = Toolchain.objects.get_or_create(
            name=f"tl-{release}-cu128",
            defaults={
                "tilelang_version": release,
                "components": components,
                "fingerprint": fingerprint_of(components),
            },
        )
        Toolchain.objects.filter(pk=toolchain.pk).update(
            created_at=start + timedelta(days=DAYS * k / len(RELEASES))
        )
        toolchains.append(toolchain)
    Toolchain.objects.update(is_current=False)
    Toolchain.objects.filter(pk=toolchains[CURRENT].pk).update(is_current=True)
    runners = {}
    for backend in ("cuda", "hip", "metal", "c", "npu"):
        runner, _ = Runner.objects.get_or_create(
            name=f"lab-{backend}",
            defaults={
                "public_key": secrets.token_hex(32),
                "state": (
                    Runner.State.OFFLINE if backend == "npu" else Runner.State.ONLINE
                ),
                "inventory": {"nvcc": backend == "cuda"},
                "last_heartbeat": datetime.now(UTC),
            },
        )
        runner.device_types.set(DeviceType.objects.filter(backend=backend))
        for toolchain in toolchains[CURRENT:]:
            RunnerToolchain.objects.get_or_create(
                runner=runner,
                toolchain=toolchain,
                defaults={
                    "interpreter": f"/opt/toolchains/{toolchain.name}/bin/python"
                },
            )
        runners[backend] = runner.pk
    users = get_user_model().objects
    proposer = users.filter(username="bench-proposer").first() or users.create_user(
        "bench-proposer", password=None
    )
    proposer.groups.add(Group.objects.get(name="reviewer"))
    return {"toolchains": [t.pk for t in toolchains], "runners": runners}
