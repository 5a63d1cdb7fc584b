"""The manifest: the approved (operator, dtype, device type, shape rule) ->
``tilelang`` | ``reference`` table that ``runners.dispatch`` reads."""

from __future__ import annotations

from django.db import IntegrityError, transaction
from django.utils import timezone

from matrix.gate.diff import CellDiff, serve_floor
from matrix.gate.sustained import sustained_key, sustained_speeds
from matrix.models import DeviceType, Status, Toolchain
from matrix.models.gate import (
    ManifestEntry,
    ManifestSnapshot,
    Policy,
    ProposalState,
    UpgradeProposal,
)

FORMAT = "tilematrix-manifest/1"
ENTRIES_PER_STATEMENT = 500
Choice = ManifestEntry.Choice


def times(speed: float, floor: float | None = None) -> str:
    """A speed ratio as people read it: two decimals, or two significant
    figures where two decimals would say 0.00. Given the ``floor`` a served
    speed must reach, as many more decimals as it takes for the number shown
    to fall on the same side of it as the speed: 0.996 is "0.996×", not a
    "1.00×" that reads as fast enough beside a reference served."""
    if speed < 0.1:
        return f"{speed:.2g}×"
    for decimals in range(2, 7):
        shown = f"{speed:.{decimals}f}"
        if floor is None or (float(shown) >= floor) == (speed >= floor):
            break
    return f"{shown}×"


def manifest_choice(
    row: CellDiff,
    *,
    toolchain: str,
    speed_budget: float,
    sustained: float | None = None,
):
    """TileLang only where the candidate passed and its kernel was measured
    no slower than the PyTorch reference on that cell than the policy's
    speed budget allows, by the harness and, where the cell was also run at
    the power cap (``sustained``, its speed there), by that run too; the
    reference elsewhere, with why."""
    if row.candidate_status is None:
        return Choice.REFERENCE, f"not validated on {toolchain}"
    if row.candidate_status != Status.PASS:
        return Choice.REFERENCE, f"{row.candidate_status} on {toolchain}"
    if row.candidate_distrust:
        return Choice.REFERENCE, f"pass on {toolchain}, but {row.candidate_distrust}"
    if row.speed is None:
        return Choice.REFERENCE, f"pass on {toolchain}, but not timed"
    speed = times(row.speed, serve_floor(speed_budget))
    if row.slower_than_reference(speed_budget):
        return Choice.REFERENCE, f"pass on {toolchain}, but {speed} of the reference"
    if sustained is not None and sustained < serve_floor(speed_budget):
        return (
            Choice.REFERENCE,
            f"pass on {toolchain}, {speed} of the reference, but "
            f"{sustained:.4f}× at the power cap",
        )
    return Choice.TILELANG, f"validated: pass on {toolchain}, {speed} of the reference"


def manifest_entries(*, proposal: UpgradeProposal, policy: Policy) -> list:
    """One unsaved entry per cell of the proposal's stored diff: TileLang
    only where the candidate passed and is fast enough against the
    reference under ``policy``, the reference elsewhere, with why."""
    candidate = proposal.candidate
    sustained = sustained_speeds(toolchain=candidate)
    entries = []
    for stored in proposal.diff_rows.select_related("shape").order_by("position"):
        row = CellDiff.from_row(stored)
        choice, reason = manifest_choice(
            row,
            toolchain=candidate.name,
            speed_budget=policy.speed_budget,
            sustained=sustained.get(sustained_key(row)),
        )
        entries.append(
            ManifestEntry(
                proposal=proposal,
                toolchain=candidate,
                device_type_id=row.device_type_id,
                shape_id=row.shape_id,
                operator=row.operator,
                dtype=row.dtype,
                dims=stored.shape.dims,
                choice=choice,
                reason=reason,
                revision_sha256=row.candidate_revision_sha256,
                result_id=row.candidate_result_id,
            )
        )
    return entries


def manifest_entries_write(*, proposal: UpgradeProposal, policy: Policy) -> int:
    """Replace the proposal's rows with ``manifest_entries``."""
    proposal.manifest_entries.all().delete()
    entries = manifest_entries(proposal=proposal, policy=policy)
    ManifestEntry.objects.bulk_create(entries, batch_size=ENTRIES_PER_STATEMENT)
    return len(entries)


def declared_order(dims_key: str) -> dict[str, int]:
    """Dims in the operator's declared order. The JSON column cannot keep it:
    PostgreSQL's jsonb sorts object keys."""
    return {k: int(v) for k, v in (part.split("=") for part in dims_key.split(","))}


def manifest_for(
    *, toolchain: Toolchain, device_type: DeviceType | None = None
) -> dict:
    """The table for one toolchain, of one device type when given. Where
    several approved proposals cover the same cell, the most recently
    approved one speaks for it."""
    # The columns the table shows, not the rows: select_related copied the
    # wide proposal row (its note, its policy) into every entry, and at 37k
    # entries PostgreSQL sorted 75 MB on disk to order them. Device types
    # are a handful, read once.
    entries = (
        ManifestEntry.objects.filter(
            toolchain=toolchain,
            proposal__state__in=[ProposalState.APPROVED, ProposalState.ROLLED_OUT],
        )
        .order_by("-proposal__approved_at", "-proposal_id")
        .values_list(
            "device_type_id",
            "shape_id",
            "operator",
            "dtype",
            "shape__dims_key",
            "choice",
            "reason",
            "revision_sha256",
            "proposal_id",
        )
    )
    if device_type is not None:
        entries = entries.filter(device_type=device_type)
    device_types = {d.pk: (str(d), d.backend) for d in DeviceType.objects.all()}
    seen = set()
    # A shape's rule once, shared by its rows on every device type (its
    # parsing was half the build), and its sort key with it.
    rules: dict[str, tuple[dict, str]] = {}
    keyed = []
    for dt_id, shape_id, operator, dtype, dims_key, choice, reason, sha, pk in entries:
        key = (dt_id, shape_id)
        if key in seen:
            continue
        seen.add(key)
        name, backend = device_types[dt_id]
        rule = rules.get(dims_key)
        if rule is None:
            dims = {"dims": declared_order(dims_key)}
            rule = rules[dims_key] = (dims, str(dims))
        row = {
            "operator": operator,
            "dtype": dtype,
            "device_type": name,
            "backend": backend,
            "shape_rule": rule[0],
            "choice": choice,
            "reason": reason,
            "kernel_sha256": sha,
            "proposal": pk,
        }
        keyed.append(((operator, dtype, name, rule[1]), row))
    keyed.sort(key=lambda pair: pair[0])
    rows = [row for _, row in keyed]
    return {
        "format": FORMAT,
        "toolchain": {
            "name": toolchain.name,
            "fingerprint": toolchain.fingerprint,
            "tilelang_version": toolchain.tilelang_version,
        },
        "generated_at": timezone.now().isoformat(),
        "entries": rows,
    }


def snapshot_read(key: str) -> bytes | None:
    """The gzipped manifest kept for ``key`` (its version included), or None."""
    packed = (
        ManifestSnapshot.objects.filter(key=key)
        .values_list("body_gzip", flat=True)
        .first()
    )
    return None if packed is None else bytes(packed)


def snapshot_keep(key: str, packed: bytes) -> None:
    """Keep ``packed`` as the snapshot of ``key``'s read, in place of the
    version before (one row a read). Two readers keeping it at once: the
    second's write is the first's, or is left out."""
    read = key.partition("@")[0]
    try:
        with transaction.atomic():
            ManifestSnapshot.objects.update_or_create(
                read=read, defaults={"key": key, "body_gzip": packed}
            )
    except IntegrityError:
        pass
