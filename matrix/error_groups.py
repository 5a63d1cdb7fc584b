"""Cells grouped by error signature, a page of groups at a time: the failing
ones, and apart from them the unsupported ones.

Five queries for both sections whatever the size of the matrix: the count
of cells per signature (one aggregate over Cell, ``error_counts``), then,
for the groups on the pages shown only (``error_pages``), their operators
and statuses, their first cells (a window over each signature, served
weight first), the names of those cells' device types and the message of
each group's first cell. Nothing reads kernel sources or result details."""

from __future__ import annotations

from dataclasses import dataclass, field

from django.db.models import BooleanField, Case, Count, F, Value, When, Window
from django.db.models.functions import RowNumber

from matrix.models import Cell, DeviceType, Result, Status, Toolchain

GROUPS_PER_PAGE = 25
CELLS_PER_GROUP = 10


@dataclass
class ErrorCell:
    """One cell a signature touches, as the errors page lists it."""

    shape_id: int
    device_type_id: int
    operator: str
    dims_key: str
    dtype: str
    status: str
    device_type: str = ""


@dataclass
class ErrorGroup:
    signature: str
    count: int
    message: str = ""
    statuses: list[str] = field(default_factory=list)
    # Every operator the signature touches, not only those of ``cells``.
    operators: list[str] = field(default_factory=list)
    cells: list[ErrorCell] = field(default_factory=list)  # the first few


@dataclass
class ErrorPage:
    groups: list[ErrorGroup]
    signatures: int  # groups on every page together
    cells: int  # cells in those groups
    first: int  # 1-based place of the page's first group
    next: str | None  # the cursor of the page after this one

    @property
    def last(self) -> int:
        return self.first + len(self.groups) - 1

    @property
    def left(self) -> int:
        """Groups after this page."""
        return self.signatures - self.last


def cursor_of(group: ErrorGroup) -> str:
    return f"{group.count}.{group.signature}"


def _cells(toolchain: Toolchain | None):
    """Cells with an error signature, each marked ``declared`` when it is
    unsupported rather than failing."""
    cells = Cell.objects.exclude(error_signature="")
    if toolchain is not None:
        cells = cells.filter(toolchain=toolchain)
    return cells.annotate(
        declared=Case(
            When(status=Status.UNSUPPORTED, then=Value(True)),
            default=Value(False),
            output_field=BooleanField(),
        )
    )


def error_counts(toolchain: Toolchain | None) -> dict[bool, list[tuple[int, str]]]:
    """(count, signature) of every group, largest first then by signature;
    failing under False, unsupported under True. One query."""
    counts: dict[bool, list[tuple[int, str]]] = {False: [], True: []}
    for declared, signature, n in (
        _cells(toolchain)
        .order_by()
        .values_list("declared", "error_signature")
        .annotate(n=Count("id"))
    ):
        counts[declared].append((n, signature))
    for ranked in counts.values():
        ranked.sort(key=lambda row: (-row[0], row[1]))
    return counts


def page_start(ranked: list[tuple[int, str]], cursor: str) -> int:
    """Where the page after the group ``cursor`` names starts: the first
    group ordered after it, so later pages hold their place however counts
    change before them. Not a cursor: the first page."""
    count, _, signature = (cursor or "").partition(".")
    if not signature or not count.isascii() or not count.isdigit():
        return 0
    mark = (-int(count), signature)
    return next((i for i, (n, s) in enumerate(ranked) if (-n, s) > mark), len(ranked))


def error_pages(
    toolchain: Toolchain | None,
    *,
    counts: dict[bool, list[tuple[int, str]]] | None = None,
    starts: tuple[int, int] = (0, 0),
    per_page: int | None = None,
    per_group: int | None = None,
) -> tuple[ErrorPage, ErrorPage]:
    """(failing, unsupported) on ``toolchain`` (every toolchain when None):
    the page of each that starts at ``starts`` (see ``page_start``), from
    ``counts`` (``error_counts``; read when not given).

    Unsupported cells are outside what their kernel declares. They are not
    failures (production uses the reference there), so they are never mixed
    into the failing groups."""
    per_page = per_page or GROUPS_PER_PAGE
    per_group = per_group or CELLS_PER_GROUP
    if counts is None:
        counts = error_counts(toolchain)
    pages, groups = [], {}
    for declared, start in ((False, starts[0]), (True, starts[1])):
        ranked = counts[declared]
        page = [ErrorGroup(s, n) for n, s in ranked[start : start + per_page]]
        groups.update({(declared, g.signature): g for g in page})
        pages.append(
            ErrorPage(
                groups=page,
                signatures=len(ranked),
                cells=sum(n for n, _ in ranked),
                first=start + 1,
                next=cursor_of(page[-1]) if start + per_page < len(ranked) else None,
            )
        )
    if groups:
        # By signature alone (an index lookup): a signature both failing and
        # unsupported elsewhere brings rows of a group not shown, left out
        # as they are read. One condition per group on the annotated
        # ``declared`` cost more to build than the queries took to run.
        signatures = {signature for _, signature in groups}
        _fill(
            _cells(toolchain).filter(error_signature__in=signatures), groups, per_group
        )
    return pages[0], pages[1]


def _fill(cells, groups: dict[tuple[bool, str], ErrorGroup], per_group: int) -> None:
    """Operators, statuses, first cells and message of the groups shown."""
    for declared, signature, operator, status in (
        cells.order_by()
        .values_list("declared", "error_signature", "shape__operator__name", "status")
        .distinct()
    ):
        group = groups.get((declared, signature))
        if group is None:
            continue
        if operator not in group.operators:
            group.operators.append(operator)
        if status not in group.statuses:
            group.statuses.append(status)
    first = (
        cells.annotate(
            place=Window(
                RowNumber(),
                partition_by=[F("declared"), F("error_signature")],
                order_by=[F("shape__weight").desc(), F("shape__dims_key"), F("pk")],
            )
        )
        .filter(place__lte=per_group)
        .order_by("error_signature", "place")
        .values_list(
            "declared",
            "error_signature",
            "shape_id",
            "device_type_id",
            "shape__operator__name",
            "shape__dims_key",
            "shape__dtype",
            "status",
            "result_id",
        )
    )
    sample: dict[tuple[bool, str], int] = {}
    for declared, signature, *shown, result in first:
        if (declared, signature) not in groups:
            continue
        sample.setdefault((declared, signature), result)
        groups[declared, signature].cells.append(ErrorCell(*shown))
    names = {
        d.pk: str(d)
        for d in DeviceType.objects.filter(
            pk__in={c.device_type_id for g in groups.values() for c in g.cells}
        )
    }
    messages = dict(
        Result.objects.filter(pk__in=sample.values()).values_list("pk", "error__text")
    )
    for key, group in groups.items():
        group.operators.sort()
        group.statuses.sort()
        group.message = messages.get(sample.get(key)) or ""
        for cell in group.cells:
            cell.device_type = names.get(cell.device_type_id, "")
