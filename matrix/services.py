"""Workflows that span several models. Each is atomic: bad input raises a
ValidationError naming the problem, and nothing is half-written."""

from __future__ import annotations

import math

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import Max, Sum

from matrix import profiles, revisions
from matrix.models import (
    Backend,
    CurrentRevision,
    DeviceType,
    Dtype,
    KernelRevision,
    Operator,
    ServedCall,
    Shape,
    Toolchain,
    dims_key,
    fingerprint_of,
)

DEMO_DEVICE_TYPES = [
    {
        "vendor": "NVIDIA",
        "model": "H200",
        "arch": "sm_90a",
        "backend": "cuda",
        "memory_gb": 141,
    },
    {
        "vendor": "AMD",
        "model": "MI300X",
        "arch": "gfx942",
        "backend": "hip",
        "memory_gb": 192,
    },
    {
        "vendor": "Apple",
        "model": "M3 Max",
        "arch": "",
        "backend": "metal",
        "memory_gb": 64,
    },
    {"vendor": "x86-64", "model": "CPU", "arch": "", "backend": "c", "memory_gb": None},
]
# Small float32 shapes the CPU (`c`) column can really run, ragged on purpose.
CPU_SHAPES = {
    "elementwise_add": [{"M": 64, "N": 256}, {"M": 7, "N": 33}],
    "row_sum": [{"M": 64, "N": 256}, {"M": 7, "N": 33}],
    "softmax": [{"M": 64, "N": 256}, {"M": 7, "N": 33}],
    "rmsnorm": [{"M": 64, "N": 256}, {"M": 7, "N": 33}],
    "gemm": [{"M": 64, "N": 64, "K": 64}, {"M": 17, "N": 31, "K": 45}],
}
# Kernels index tensors with 32-bit integers.
DIM_MAX = 2**31 - 1
# Elements of all a call's tensors together: 2 TB at fp16, beyond any one
# device's memory. A larger shape is a typo the harness would only report as
# the kernel's failure.
ELEMENTS_MAX = 2**40
# Calls per forward step (or share of time): a bound that keeps sums finite.
WEIGHT_MAX = 1e12


@transaction.atomic
def operator_sync_library() -> list[Operator]:
    """Mirror the kernel library into the catalogue: one Operator per module
    and its current library revision, pinned by the module source's sha256;
    on a backend where a reviewer approved a submitted revision, that one
    stays current (the library's is kept beside it for a revert).

    A few statements for the whole library, not a dozen an operator: it runs
    at every start and in every test that seeds the catalogue."""
    from runners import kernels
    from runners.kernels.revision import library_source, revision_sha256

    specs = kernels.OPERATORS
    Operator.objects.bulk_create(
        [
            Operator(name=name, dims=list(spec.dims), description=spec.description)
            for name, spec in specs.items()
        ],
        update_conflicts=True,
        unique_fields=["name"],
        update_fields=["dims", "description"],
    )
    operators = {op.name: op for op in Operator.objects.filter(name__in=specs)}
    # The operator's module and the library modules it imports, as a runner
    # hashes its copy before it runs a library job.
    sources = {name: library_source(name) for name in specs}
    digests = {name: revision_sha256(source) for name, source in sources.items()}
    # A revision already stored is kept as it is.
    KernelRevision.objects.bulk_create(
        [
            KernelRevision(
                operator=operators[name],
                source_sha256=digests[name],
                source=sources[name],
                origin=KernelRevision.Origin.LIBRARY,
                review_state=KernelRevision.Review.APPROVED,
            )
            for name in specs
        ],
        ignore_conflicts=True,
    )
    library = {
        (r.operator_id, r.source_sha256): r
        for r in KernelRevision.objects.filter(
            operator__in=operators.values(), source_sha256__in=digests.values()
        )
    }
    current = revisions.current_map()
    # A backend follows the library unless a reviewer made a submission
    # current there: a start-up's sync never overrides that decision.
    decided = set(
        CurrentRevision.objects.filter(
            operator__in=operators.values(),
            revision__origin=KernelRevision.Origin.SUBMITTED,
        ).values_list("operator_id", "backend")
    )
    synced = []
    for name in specs:
        op = operators[name]
        revision = library[(op.pk, digests[name])]
        following = [
            b
            for b in Backend.values
            if (op.pk, b) not in decided and current.get((op.pk, b)) != revision.pk
        ]
        if following:
            revisions.make_current(revision, following)
        synced.append(op)
    return synced


def shape_clean(
    *, operator: Operator, dims, dtype: str, largest_gb: float | None = None
) -> dict:
    """``largest_gb``: the catalogue's largest device memory, when the caller
    cleans many shapes and has read it once (see ``largest_device_gb``)."""
    from runners import kernels

    dims = operator.clean_dims(dims)
    for name, value in dims.items():
        if value > DIM_MAX:
            raise ValidationError({"dims": f"{name} must be at most {DIM_MAX}"})
    if dtype not in Dtype.values:
        raise ValidationError(
            {"dtype": f"unknown dtype {dtype!r}; expected one of {Dtype.values}"}
        )
    # An operator outside the library declares no tensors here; its dims are
    # bounded all the same.
    spec = kernels.OPERATORS.get(operator.name)
    if spec is not None:
        tensors = spec.inputs(dims, dtype) + spec.outputs(dims, dtype)
        elements = sum(math.prod(t.shape) for t in tensors)
        if elements > ELEMENTS_MAX:
            raise ValidationError(
                {
                    "dims": f"{dims_key(dims)} makes tensors of {elements:.3g} "
                    f"elements in all; at most {ELEMENTS_MAX:.3g}"
                }
            )
        _fits_a_device(
            dims,
            spec.inputs(dims, dtype),
            spec.outputs(dims, dtype),
            largest_gb if largest_gb is not None else largest_device_gb(),
        )
    return dims


ITEM_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}


def largest_device_gb() -> float:
    """The largest memory a device type of the catalogue states; 0 when none
    states one (a CPU bounds nothing)."""
    return DeviceType.objects.aggregate(m=Max("memory_gb"))["m"] or 0


def _fits_a_device(dims: dict, inputs, outputs, largest: float) -> None:
    """Refuse a shape no device of the catalogue could hold: a validation
    job holds the inputs, the kernel's outputs and the reference's. Device
    types that state no memory (a CPU) bound nothing."""
    if not largest:
        return
    need = sum(math.prod(t.shape) * ITEM_BYTES.get(t.dtype, 4) for t in inputs)
    need += 2 * sum(math.prod(t.shape) * ITEM_BYTES.get(t.dtype, 4) for t in outputs)
    if need > largest * 1e9:
        raise ValidationError(
            {
                "dims": f"{dims_key(dims)} needs {need / 1e9:,.0f} GB for its "
                f"inputs and two copies of its outputs; the largest device in "
                f"the catalogue has {largest} GB"
            }
        )


def weight_clean(weight) -> float:
    if (
        isinstance(weight, bool)
        or not isinstance(weight, int | float)
        # Compared before any float(): an int past a float's range overflows.
        or not 0 <= weight <= WEIGHT_MAX
    ):
        raise ValidationError(f"weight must be a number from 0 to {WEIGHT_MAX:.0e}")
    return float(weight)


def tokens_clean(tokens) -> int:
    if isinstance(tokens, bool) or not isinstance(tokens, int):
        raise ValidationError("tokens must be an integer")
    if not 0 <= tokens <= DIM_MAX:
        raise ValidationError(f"tokens must be from 1 to {DIM_MAX} (0: not recorded)")
    return tokens


@transaction.atomic
def shape_import(*, rows, source_profile: str, served: bool = True) -> int:
    """Create or update shapes from (operator name, dims, dtype, weight) rows,
    or (operator name, dims, dtype, calls, tokens) rows: the calls of one
    forward step of that many tokens. A shape's weight is then the sum of
    its rows' calls (calls per forward step over the steps imported); rows
    without tokens each give the weight (the last one wins). Served shapes
    also record, per model, how often it calls them (``ServedCall``): an
    import replaces that model's counts for the shapes it names, and a
    served shape's weight is then the sum over every model that calls it.
    Every row is validated before the first write."""
    operators = {op.name: op for op in Operator.objects.all()}
    largest_gb = largest_device_gb()  # once, not once a row
    clean = []
    for i, row in enumerate(rows, start=1):
        name, dims, dtype, weight = row[:4]
        if not isinstance(name, str) or name not in operators:
            raise ValidationError(f"row {i}: unknown operator {name!r}")
        try:
            dims = shape_clean(
                operator=operators[name], dims=dims, dtype=dtype, largest_gb=largest_gb
            )
            weight = weight_clean(weight)
            tokens = tokens_clean(row[4]) if len(row) > 4 else None
        except ValidationError as exc:
            raise ValidationError(
                f"row {i} ({name}): {'; '.join(exc.messages)}"
            ) from None
        clean.append((operators[name], dims, dtype, weight, tokens))
    weights: dict[tuple, float] = {}
    calls: dict[tuple, dict[int, float]] = {}
    # A shape named by several rows is written once, with the first's dims.
    first_dims: dict[tuple, dict] = {}
    for op, dims, dtype, weight, tokens in clean:
        key = (op, dims_key(dims), dtype)
        first_dims.setdefault(key, dims)
        steps = calls.setdefault(key, {})
        if tokens is None:
            weights[key] = weight
            steps.clear()
            steps[0] = weight
        else:
            weights[key] = weights.get(key, 0.0) + weight
            steps[tokens] = steps.get(tokens, 0.0) + weight
    # A few statements for the whole import, not a few per shape: the demo
    # catalogue's import made 4 per shape, at every start and in every test
    # that seeds it.
    shapes = _shapes_of(weights)
    missing = [
        Shape(
            operator=op,
            dims_key=key,
            dtype=dtype,
            dims=first_dims[(op, key, dtype)],
            served=served,
            weight=weight,
            source_profile=source_profile,
        )
        for (op, key, dtype), weight in weights.items()
        if (op.pk, key, dtype) not in shapes
    ]
    if missing:
        # Another import may write the same shapes meanwhile: theirs stand.
        Shape.objects.bulk_create(missing, ignore_conflicts=True)
        shapes = _shapes_of(weights)
    if served:
        named = [shapes[(op.pk, key, dtype)] for op, key, dtype in weights]
        ServedCall.objects.filter(source=source_profile, shape__in=named).delete()
        ServedCall.objects.bulk_create(
            ServedCall(
                source=source_profile,
                shape=shapes[(op.pk, key, dtype)],
                tokens=t,
                calls=n,
            )
            for (op, key, dtype), steps in calls.items()
            for t, n in sorted(steps.items())
        )
        # A shape several models call weighs their calls together: the
        # order of imports, or importing one again, changes nothing.
        totals = dict(
            ServedCall.objects.filter(shape__in=named)
            .values_list("shape")
            .annotate(total=Sum("calls"))
        )
        changed = []
        for (op, key, dtype), weight in weights.items():
            shape = shapes[(op.pk, key, dtype)]
            weight = totals.get(shape.pk) or weight
            if not shape.served or shape.weight != weight:
                shape.served, shape.weight = True, weight
                shape.source_profile = shape.source_profile or source_profile
                changed.append(shape)
        Shape.objects.bulk_update(changed, ["served", "weight", "source_profile"])
    return len(clean)


def _shapes_of(keys) -> dict[tuple, Shape]:
    """The stored shapes among ``keys`` ((operator, dims key, dtype)), by
    (operator id, dims key, dtype)."""
    keys = {(op.pk, key, dtype) for op, key, dtype in keys}
    candidates = Shape.objects.filter(
        operator_id__in={k[0] for k in keys},
        dims_key__in={k[1] for k in keys},
        dtype__in={k[2] for k in keys},
    )
    found = {(s.operator_id, s.dims_key, s.dtype): s for s in candidates}
    return {k: shape for k, shape in found.items() if k in keys}


@transaction.atomic
def served_model_remove(source: str) -> tuple[int, int]:
    """Stop counting a model's calls: its ServedCall rows go; a shape no
    other model calls is no longer served (its results stay, for the
    history); one another model calls weighs those calls alone. Returns
    (shapes it called, shapes no longer served); ValidationError for a model
    that was never imported."""
    calls = ServedCall.objects.filter(source=source)
    shape_ids = set(calls.values_list("shape_id", flat=True))
    if not shape_ids:
        known = sorted(set(ServedCall.objects.values_list("source", flat=True)))
        raise ValidationError(
            f"no served model {source!r}; imported: {', '.join(known) or 'none'}"
        )
    calls.delete()
    remaining = dict(
        ServedCall.objects.filter(shape_id__in=shape_ids)
        .values_list("shape_id")
        .annotate(total=Sum("calls"))
    )
    unserved = shape_ids - set(remaining)
    Shape.objects.filter(pk__in=unserved).update(served=False, weight=0.0)
    for shape_id, total in remaining.items():
        Shape.objects.filter(pk=shape_id).update(weight=total)
    return len(shape_ids), len(unserved)


@transaction.atomic
def toolchain_register(
    *, name: str, components: dict, current: bool = False
) -> Toolchain:
    """Record a toolchain by its fingerprint; the same components under a new
    name, or a taken name, are refused with the reason."""
    fingerprint = fingerprint_of(components)
    existing = Toolchain.objects.filter(fingerprint=fingerprint).first()
    if existing is not None:
        if existing.name != name:
            raise ValidationError(
                f"toolchain fingerprint {fingerprint[:12]} is already registered as {existing.name!r}"
            )
        return existing
    if current:
        Toolchain.objects.filter(is_current=True).update(is_current=False)
    try:
        with transaction.atomic():
            return Toolchain.objects.create(
                name=name,
                tilelang_version=str(components.get("tilelang", "")),
                components=components,
                fingerprint=fingerprint,
                is_current=current,
            )
    except IntegrityError:
        raise ValidationError(f"a toolchain named {name!r} already exists") from None


@transaction.atomic
def catalog_seed() -> dict:
    """The demo catalogue; running it again changes nothing."""
    # A device type already there keeps its memory.
    DeviceType.objects.bulk_create(
        [DeviceType(**spec) for spec in DEMO_DEVICE_TYPES], ignore_conflicts=True
    )
    operators = operator_sync_library()
    shape_import(
        rows=list(profiles.served_calls("llama-3-8b")), source_profile="llama-3-8b"
    )
    known = {op.name for op in operators}
    cpu_rows = [
        (name, dims, "float32", 0.0)
        for name, shapes in CPU_SHAPES.items()
        if name in known
        for dims in shapes
    ]
    shape_import(rows=cpu_rows, source_profile="cpu-smoke", served=False)
    return {
        "device_types": DeviceType.objects.count(),
        "operators": Operator.objects.count(),
        "shapes": Shape.objects.count(),
        "served": Shape.objects.served().count(),
    }
