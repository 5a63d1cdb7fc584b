"""Which kernel revision runs where. An operator has one current revision per
backend (``CurrentRevision``): the library's, wherever no reviewed decision
chose another; a submission approved for some backends, on those only; an
earlier approved revision that a reviewer reverted to.

A cell is stale when its revision is not the one current on its device
type's backend. Every change of a current revision goes through
``make_current``, which also keeps ``KernelRevision.is_current`` (current on
some backend) true to the rows.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import transaction
from django.db.models import Count, Exists, OuterRef, Q

from matrix.models import Backend, Cell, CurrentRevision, DeviceType, KernelRevision

CurrentMap = dict[tuple[int, str], int]


def current_map() -> CurrentMap:
    """(operator id, backend) -> id of the revision current there."""
    return {
        (op, backend): rev
        for op, backend, rev in CurrentRevision.objects.values_list(
            "operator_id", "backend", "revision_id"
        )
    }


def current_id(operator_id: int, backend: str) -> int | None:
    return (
        CurrentRevision.objects.filter(operator_id=operator_id, backend=backend)
        .values_list("revision_id", flat=True)
        .first()
    )


def is_current_cell() -> Exists:
    """For a Cell queryset: the cell's revision is current on its device
    type's backend."""
    return Exists(
        CurrentRevision.objects.filter(
            operator_id=OuterRef("shape__operator_id"),
            backend=OuterRef("device_type__backend"),
            revision_id=OuterRef("revision_id"),
        )
    )


def stale_q(current: CurrentMap, operator_id: int, device_types) -> Q:
    """Cells of one operator on ``device_types`` whose revision is not the
    current one of their backend, as a Q over Cell."""
    by_backend: dict[str, list[int]] = {}
    for d in device_types:
        by_backend.setdefault(d.backend, []).append(d.pk)
    stale = Q(pk__in=[])
    for backend, ids in by_backend.items():
        on = Q(device_type_id__in=ids)
        rev = current.get((operator_id, backend))
        stale |= on & ~Q(revision_id=rev) if rev is not None else on
    return stale


@transaction.atomic
def make_current(revision: KernelRevision, backends) -> dict[str, int | None]:
    """Make ``revision`` current on ``backends``; the id each replaced (in
    the caller's transaction where there is one: a decision's, with its
    audit event)."""
    replaced = dict.fromkeys(backends)
    replaced.update(
        CurrentRevision.objects.select_for_update()
        .filter(operator_id=revision.operator_id, backend__in=list(backends))
        .values_list("backend", "revision_id")
    )
    # One upsert for every backend, not an update_or_create (a savepoint and
    # two statements) each: the catalogue's sync does this at every start.
    CurrentRevision.objects.bulk_create(
        [
            CurrentRevision(
                operator_id=revision.operator_id, backend=backend, revision=revision
            )
            for backend in backends
        ],
        update_conflicts=True,
        unique_fields=["operator", "backend"],
        update_fields=["revision"],
    )
    touched = {revision.pk, *(r for r in replaced.values() if r is not None)}
    KernelRevision.objects.filter(pk__in=touched).update(
        is_current=Exists(CurrentRevision.objects.filter(revision_id=OuterRef("pk")))
    )
    return replaced


def backends_of(revision: KernelRevision) -> list[str]:
    """The backends a revision covers: a submission's own list, or every
    backend for the library's."""
    return list(revision.backends) or list(Backend.values)


@dataclass(frozen=True)
class Change:
    """What making a revision current on some backends would do, for the
    page that asks for a confirmation."""

    revision_id: int
    backends: list[str]
    replaced: dict[str, int | None]
    device_types: list[str]
    cells_stale: int
    served_stale: int

    @property
    def backend_labels(self) -> list[str]:
        labels = dict(Backend.choices)
        return [labels[b] for b in self.backends]

    @property
    def stale_words(self) -> str:
        """ "3 cells go stale (1 served)", for the messages after a decision."""
        cells = "cell" if self.cells_stale == 1 else "cells"
        return f"{self.cells_stale} {cells} went stale ({self.served_stale} served)"

    @property
    def changes_anything(self) -> bool:
        return any(r != self.revision_id for r in self.replaced.values())


def change_preview(revision: KernelRevision, backends) -> Change:
    """The cells that would go stale (on every toolchain) and the device
    types whose jobs would run ``revision``, were it made current on
    ``backends``."""
    backends = [b for b in backends if b != ""]
    replaced = dict.fromkeys(backends)
    replaced.update(
        CurrentRevision.objects.filter(
            operator_id=revision.operator_id, backend__in=backends
        ).values_list("backend", "revision_id")
    )
    moving = [b for b, r in replaced.items() if r != revision.pk]
    cells = Cell.objects.filter(
        shape__operator_id=revision.operator_id, device_type__backend__in=moving
    ).exclude(revision_id=revision.pk)
    return Change(
        revision_id=revision.pk,
        backends=backends,
        replaced=replaced,
        device_types=[
            str(d) for d in DeviceType.objects.filter(backend__in=moving).order_by()
        ],
        **cells.filter(is_current_cell()).aggregate(
            cells_stale=Count("id"),
            served_stale=Count("id", filter=Q(shape__served=True)),
        ),
    )
