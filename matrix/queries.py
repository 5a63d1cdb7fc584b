"""Coverage and error-group reads for the pages and the API (the gaps are in
``matrix.gaps``).

Every read here goes through ``Cell`` (the latest result per cell) and never
scans ``Result``: the number of stored results grows without bound, the
number of cells only with the catalogue. (``cells_version`` reads the newest
result id, one primary-key index lookup.) Each function issues a fixed number
of queries, whatever the size of the matrix.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import NamedTuple

from django.db import connection
from django.db.models import Count, Exists, OuterRef, Q

from matrix import revisions
from matrix.models import (
    BACKEND_PRIORITY,
    EVIDENCE,
    FAILURES,
    ID_MAX,
    Backend,
    Cell,
    CurrentRevision,
    DeviceType,
    Dtype,
    KernelRevision,
    Operator,
    Result,
    ServedCall,
    Shape,
    Status,
    Toolchain,
    UpgradeProposal,
)

STALE = "stale"
EMPTY = "empty"
# Filter values beside the Status ladder: a cell run on a superseded toolchain
# or a kernel revision no longer current, and a cell never run.
STATE_FILTERS = [*Status.values, STALE, EMPTY]

# (icon, short text, long text): every state reads without colour too.
STATE_LABELS = {
    Status.PASS: ("✓", "pass", "pass: ran and matched the reference"),
    Status.LOWERED: ("◔", "lowered", "lowered: codegen only, not validated"),
    Status.BUILT: ("◑", "built", "built: binary produced, not run"),
    Status.COMPILE_ERROR: ("✗", "compile", "compile error"),
    Status.MISMATCH: ("≠", "mismatch", "mismatch: wrong numbers"),
    Status.UNSTABLE: ("≈", "unstable", "unstable: right on some runs, wrong on others"),
    Status.RUNTIME_ERROR: ("!", "runtime", "runtime error"),
    Status.TIMEOUT: ("◷", "timeout", "timeout"),
    Status.UNSUPPORTED: ("–", "unsup.", "unsupported: production uses the reference"),
    Status.INFRA_ERROR: ("?", "infra", "infrastructure error, retried"),
    EMPTY: ("·", "not run", "never run"),
}


def state_label(status: str) -> tuple[str, str, str]:
    return STATE_LABELS.get(status, ("?", status, status))


def status_kind(status: str) -> str:
    """The colour family of a status: pass, evidence, fail, unsupported, empty."""
    if status == Status.PASS:
        return "pass"
    if status in EVIDENCE:
        return "evidence"
    if status in FAILURES:
        return "fail"
    if status == Status.UNSUPPORTED:
        return "unsupported"
    return "empty"


# Query-string filters of the pages, in the order their links carry them.
FILTER_PARAMS = (
    "toolchain",
    "dtype",
    "backend",
    "status",
    "served",
    "model",
    "device",
    "operator",
    "q",
)
# Shape text longer than any shape key is not a search.
SEARCH_MAX = 200


# The served filter's values: these show served shapes only, "0" and "off"
# (a checkbox left clear) every shape; anything else is named as unknown.
SERVED_ONLY = ("1", "on", "true")
SERVED_VALUES = (*SERVED_ONLY, "0", "off", "false")


@dataclass
class MatrixFilters:
    toolchain: Toolchain | None
    dtype: str = ""
    backend: str = ""
    status: str = ""
    served_only: bool = False
    # The current toolchain, when the chosen one is older: nothing run on
    # the chosen one can become current again.
    superseded_by: Toolchain | None = None
    # Filter name -> a value the page does not know and so ignores.
    unknown: dict[str, str] = field(default_factory=dict)
    # A served model (the source of its calls), one device type, one
    # operator by name, and text within a shape's key ("M=1,", "4096").
    model: str = ""
    device_type: DeviceType | None = None
    operator: str = ""
    text: str = ""

    @classmethod
    def from_params(cls, params, toolchains: list[Toolchain]) -> MatrixFilters:
        """Read filters from a query string. ``toolchains`` comes from
        ``toolchain_list()``. An unknown value is ignored, so a stale
        bookmark still opens the page, and kept in ``unknown`` so the page
        can say so. A model, device type or operator is looked up only when
        the query names one: one query each."""
        by_name = {t.name: t for t in toolchains}
        current = current_toolchain(toolchains)
        default = current or (toolchains[0] if toolchains else None)
        given = {name: str(params.get(name, "")) for name in FILTER_PARAMS}
        allowed = {
            "toolchain": by_name,
            "dtype": Dtype.values,
            "backend": Backend.values,
            "status": STATE_FILTERS,
        }
        unknown = {
            name: given[name]
            for name, known in allowed.items()
            if given[name] and given[name] not in known
        }
        device_type = None
        if given["device"]:
            device_type = _device_type_named(given["device"])
            if device_type is None:
                unknown["device"] = given["device"]
        if given["model"] and not model_exists(given["model"]):
            unknown["model"] = given["model"]
        if (
            given["operator"]
            and not Operator.objects.filter(name=given["operator"]).exists()
        ):
            unknown["operator"] = given["operator"]
        if given["served"] and given["served"] not in SERVED_VALUES:
            unknown["served"] = given["served"]
        text = given["q"].strip()
        if len(text) > SEARCH_MAX:
            unknown["q"] = text[:40] + "…"
            text = ""
        kept = {name: "" if name in unknown else given[name] for name in given}
        toolchain = by_name.get(kept["toolchain"], default)
        superseded = toolchain is not None and toolchain_superseded(toolchain, current)
        return cls(
            toolchain=toolchain,
            dtype=kept["dtype"],
            backend=kept["backend"],
            status=kept["status"],
            served_only=given["served"] in SERVED_ONLY,
            superseded_by=current if superseded else None,
            unknown=unknown,
            model=kept["model"],
            device_type=device_type,
            operator=kept["operator"],
            text=text,
        )

    @property
    def toolchain_stale(self) -> bool:
        """Every result on the chosen toolchain is stale."""
        return self.superseded_by is not None

    @property
    def unknown_notes(self) -> list[str]:
        """What the page shows in place of each value it does not know."""
        return self._notes(FILTER_PARAMS)

    @property
    def toolchain_notes(self) -> list[str]:
        """For the pages that read only the toolchain (a cell, the errors)."""
        return self._notes(("toolchain",))

    def _notes(self, names) -> list[str]:
        notes = []
        for name, value in self.unknown.items():
            if name not in names:
                continue
            if name == "q":
                notes.append(
                    f"Shape search “{value}” is longer than {SEARCH_MAX} "
                    "characters: showing every shape instead."
                )
                continue
            label = "device type" if name == "device" else name
            if name == "served":
                notes.append(
                    f"Unknown served “{value}”: showing every shape, served or not "
                    "(served=1 shows the served ones)."
                )
                continue
            if name != "toolchain":
                shown = f"showing every {label} instead"
            elif self.toolchain is not None:
                shown = f"showing {self.toolchain} instead"
            else:
                shown = "no toolchain is registered yet"
            notes.append(f"Unknown {label} “{value}”: {shown}.")
        return notes

    def as_params(self) -> dict[str, str]:
        params = {
            "toolchain": self.toolchain.name if self.toolchain else "",
            "dtype": self.dtype,
            "backend": self.backend,
            "status": self.status,
            "served": "1" if self.served_only else "",
            "model": self.model,
            "device": str(self.device_type.pk) if self.device_type else "",
            "operator": self.operator,
            "q": self.text,
        }
        return {k: v for k, v in params.items() if v}

    def shape_q(self, prefix: str = "") -> Q:
        q = Q()
        if self.dtype:
            q &= Q(**{f"{prefix}dtype": self.dtype})
        if self.served_only:
            q &= Q(**{f"{prefix}served": True})
        if self.model:
            called = ServedCall.objects.filter(source=self.model).values("shape_id")
            q &= Q(**{f"{prefix}pk__in": called})
        if self.operator:
            q &= Q(**{f"{prefix}operator__name": self.operator})
        if self.text:
            q &= Q(**{f"{prefix}dims_key__icontains": self.text})
        return q


def _device_type_named(text: str) -> DeviceType | None:
    """The device type a ``device`` filter names by id."""
    if not (text.isascii() and text.isdigit()) or int(text) > ID_MAX:
        return None
    return DeviceType.objects.filter(pk=int(text)).first()


def model_exists(source: str) -> bool:
    return ServedCall.objects.filter(source=source).exists()


def model_names() -> list[str]:
    """Every served model (profile or trace) with calls recorded."""
    return list(
        ServedCall.objects.order_by("source")
        .values_list("source", flat=True)
        .distinct()
    )


def toolchain_list() -> list[Toolchain]:
    """Every toolchain, each with ``rolled_out_baseline``: an upgrade away
    from it has rolled out."""
    rolled_out = UpgradeProposal.objects.filter(
        baseline=OuterRef("pk"), state=UpgradeProposal.State.ROLLED_OUT
    )
    return list(
        Toolchain.objects.only(
            "id", "name", "is_current", "fingerprint", "tilelang_version", "components"
        ).annotate(rolled_out_baseline=Exists(rolled_out))
    )


# A new toolchain, device type or rolled-out upgrade shows within this long
# on the pages that read these lists on every view; what each page shows of
# the data follows its data version.
CATALOGUE_S = 5


def catalogue_lists(*, fresh: bool = False) -> tuple[list[Toolchain], dict]:
    """``toolchain_list()`` and the device types by id, kept for every
    reader for ``CATALOGUE_S``; read again when ``fresh`` (a page that plans
    work reads what is there now)."""
    from django.core.cache import cache

    found = None if fresh else cache.get("catalogue-lists")
    if found is None:
        device_types = {d.pk: d for d in DeviceType.objects.all()}
        found = (toolchain_list(), device_types)
        cache.set("catalogue-lists", found, CATALOGUE_S)
    return found


def toolchains_as_of(current_id: int | None) -> list[Toolchain]:
    """The kept toolchain list, read again when the toolchain it holds as
    current is not ``current_id`` (what a version query has just read): a
    rollout shows on the next request, not after the lists expire."""
    toolchains = catalogue_lists()[0]
    if current_id != next((t.pk for t in toolchains if t.is_current), None):
        toolchains = catalogue_lists(fresh=True)[0]
    return toolchains


def find_toolchain(toolchains: list[Toolchain], ref: str | int) -> Toolchain | None:
    """The toolchain named or fingerprinted ``ref`` (or of that id) in
    ``toolchains``, or, when they do not hold it, in what is there now: a
    toolchain newer than a kept list is never refused."""

    def pick(found: list[Toolchain]) -> Toolchain | None:
        if isinstance(ref, int):
            return next((t for t in found if t.pk == ref), None)
        return next((t for t in found if ref in (t.name, t.fingerprint)), None)

    if ref == "":
        return None
    return pick(toolchains) or pick(catalogue_lists(fresh=True)[0])


def toolchain_hosts() -> dict[int, list[str]]:
    """toolchain id -> the names of the runner hosts that host it (a lab's
    runner whose evidence was imported included). One query."""
    from matrix.fleet.models import RunnerToolchain

    hosts: dict[int, list[str]] = {}
    for toolchain_id, name in RunnerToolchain.objects.order_by(
        "runner__name"
    ).values_list("toolchain_id", "runner__name"):
        hosts.setdefault(toolchain_id, []).append(name)
    return hosts


def current_toolchain(toolchains: list[Toolchain]) -> Toolchain | None:
    return next((t for t in toolchains if t.is_current), None)


def release_of(version: str) -> tuple[int, ...] | None:
    """The release numbers of a version string, trailing zeros dropped so
    that 0.2 and 0.2.0 compare equal: "0.1.6.post1+cu121" -> (0, 1, 6).
    None when it starts with no number."""
    found = re.match(r"v?(\d+(?:\.\d+)*)", version.strip())
    if found is None:
        return None
    numbers = [int(n) for n in found.group(1).split(".")]
    while len(numbers) > 1 and numbers[-1] == 0:
        numbers.pop()
    return tuple(numbers)


def toolchain_superseded(toolchain: Toolchain, current: Toolchain | None) -> bool:
    """Older than the current toolchain: a lower TileLang release, or the
    baseline of an upgrade that rolled out. Other toolchains are not older
    but different (each runner host has its own torch, Python and driver;
    an upgrade candidate is newer): results on them are judged on the kernel
    revision alone. Before any toolchain is current, none is superseded."""
    if current is None or toolchain.pk == current.pk:
        return False
    if toolchain.rolled_out_baseline:
        return True
    release = release_of(toolchain.tilelang_version)
    current_release = release_of(current.tilelang_version)
    if release is None or current_release is None:
        return False  # a version naming no release is not judged older
    return release < current_release


def device_type_list(
    filters: MatrixFilters, device_types: list[DeviceType] | None = None
) -> list[DeviceType]:
    """Device types under the backend filter, highest backend priority
    first; from ``device_types`` when given, else from the database."""
    if device_types is None:
        device_types = DeviceType.objects.all()
    if filters.backend:
        device_types = [d for d in device_types if d.backend == filters.backend]
    if filters.device_type is not None:
        device_types = [d for d in device_types if d.pk == filters.device_type.pk]
    return sorted(
        device_types,
        key=lambda d: (-BACKEND_PRIORITY.get(d.backend, 0), d.vendor, d.model),
    )


def backend_groups(device_types: list[DeviceType]) -> list[tuple[str, int]]:
    """(backend label, column span) for the grouped column header."""
    groups: list[tuple[str, int]] = []
    labels = dict(Backend.choices)
    for d in device_types:
        label = labels.get(d.backend, d.backend)
        if groups and groups[-1][0] == label:
            groups[-1] = (label, groups[-1][1] + 1)
        else:
            groups.append((label, 1))
    return groups


class PassesOn(NamedTuple):
    """Where a cell failing on one toolchain passes on another: that
    toolchain's name, the open or approved proposal to it (None: none), and
    whether the revision that failed and passes there is an older one than
    the current (``stale``: a run here would try the current revision)."""

    toolchain: str
    proposal: int | None
    stale: bool = False


def passing_elsewhere(
    failing: set[tuple[int, int]], toolchain, revisions: dict | None = None
) -> dict:
    """(shape id, device type id) -> PassesOn for each of the ``failing``
    cells (failing on ``toolchain``) whose kernel revision passes on another
    toolchain, same shape and device type: the same code fails here and
    passes there, so the toolchain makes the difference and the upgrade
    closes it. ``revisions``: the failing cells' revision ids, where the
    caller read them (else one query more). Two queries, and none where
    nothing fails."""
    from matrix.models.gate import ProposalState, UpgradeProposal

    if not failing or toolchain is None:
        return {}
    if revisions is not None:
        here = {key: revisions[key] for key in failing}
    else:
        here = {
            (s, d): revision
            for s, d, revision in Cell.objects.filter(
                toolchain=toolchain,
                shape_id__in={s for s, _ in failing},
                device_type_id__in={d for _, d in failing},
            ).values_list("shape_id", "device_type_id", "revision_id")
            if (s, d) in failing
        }
    if not here:
        return {}
    # Each failing cell's own revision on the other toolchains, by the
    # cells' (shape, device type, toolchain) index: a few rows a cell. Not
    # by revision: PostgreSQL, left to pick, walked every cell of those
    # revisions (140 ms of a gaps page at 1M results).
    table = {
        m: connection.ops.quote_name(m._meta.db_table)
        for m in (Cell, Shape, DeviceType, CurrentRevision, Toolchain)
    }
    # Ids written as numbers, not a placeholder each: the driver's parsing
    # of thousands of placeholders cost more than the statement.
    values = ", ".join(f"({int(s)}, {int(d)}, {int(r)})" for (s, d), r in here.items())
    sql = f"""
        WITH here (shape_id, device_type_id, revision_id) AS (
            VALUES {values}
        )
        SELECT p.shape_id, p.device_type_id, p.toolchain_id, t.name,
            r.revision_id IS NULL
        FROM here h
        JOIN {table[Cell]} p ON p.shape_id = h.shape_id
            AND p.device_type_id = h.device_type_id
            AND p.revision_id = h.revision_id
        JOIN {table[Shape]} s ON s.id = p.shape_id
        JOIN {table[DeviceType]} d ON d.id = p.device_type_id
        LEFT JOIN {table[CurrentRevision]} r ON r.operator_id = s.operator_id
            AND r.backend = d.backend AND r.revision_id = p.revision_id
        JOIN {table[Toolchain]} t ON t.id = p.toolchain_id
        WHERE p.status = %s AND p.toolchain_id <> %s
        ORDER BY p.toolchain_id
    """
    with connection.cursor() as cursor:
        cursor.execute(sql, [Status.PASS, toolchain.pk])
        rows = cursor.fetchall()
    if not rows:
        return {}
    proposals = dict(
        UpgradeProposal.objects.filter(
            candidate_id__in={row[2] for row in rows}, baseline=toolchain
        )
        .exclude(state__in=[ProposalState.REJECTED, ProposalState.ROLLED_OUT])
        .order_by("pk")
        .values_list("candidate_id", "pk")
    )
    return {
        (s, d): PassesOn(name, proposals.get(toolchain_id), bool(stale))
        for s, d, toolchain_id, name, stale in rows
    }


def matches(status_filter: str, status: str, stale: bool) -> bool:
    if not status_filter:
        return True
    if status_filter == STALE:
        return stale
    return status == status_filter


# Status -> colour family, looked up once per count rather than per property.
KIND_OF = {status: status_kind(status) for status in [*Status.values, EMPTY]}
BAR_ORDER = ("pass", "evidence", "fail", "unsupported", "empty")


class Tally:
    """Counts of cell states for one operator × device type, one operator
    row or one device column. The per-kind counts are derived once, when
    first read, so a page of thousands of tallies stays cheap."""

    __slots__ = ("total", "by_status", "stale", "_kinds")

    def __init__(self) -> None:
        self.total = 0
        self.by_status: dict[str, int] = {}
        self.stale = 0
        self._kinds: dict[str, int] | None = None

    def add(self, status: str, n: int, stale: bool) -> None:
        self.by_status[status] = self.by_status.get(status, 0) + n
        self.total += n
        if stale:
            self.stale += n
        self._kinds = None

    def merge(self, other: Tally) -> None:
        for status, n in other.by_status.items():
            self.by_status[status] = self.by_status.get(status, 0) + n
        self.total += other.total
        self.stale += other.stale
        self._kinds = None

    @property
    def kinds(self) -> dict[str, int]:
        if self._kinds is None:
            kinds: dict[str, int] = {}
            for status, n in self.by_status.items():
                kind = KIND_OF.get(status, "empty")
                kinds[kind] = kinds.get(kind, 0) + n
            self._kinds = kinds
        return self._kinds

    @property
    def passing(self) -> int:
        return self.kinds.get("pass", 0)

    @property
    def failing(self) -> int:
        return self.kinds.get("fail", 0)

    @property
    def evidence(self) -> int:
        return self.kinds.get("evidence", 0)

    @property
    def empty(self) -> int:
        return self.by_status.get(EMPTY, 0)

    @property
    def bar(self) -> list[tuple[str, int]]:
        """(kind, percent) segments for a stacked bar."""
        if not self.total:
            return []
        kinds = self.kinds
        return [
            (kind, round(100 * kinds[kind] / self.total))
            for kind in BAR_ORDER
            if kinds.get(kind)
        ]


@dataclass
class OperatorRow:
    operator: Operator
    shape_count: int
    cells: list[Tally]
    tally: Tally
    cells_html: str = ""
    # Set by the page: the query its toggle links to, and its shape rows
    # when it is open.
    toggle_query: str = ""
    expanded: dict | None = None


@dataclass
class MatrixSummary:
    device_types: list[DeviceType]
    rows: list[OperatorRow]
    columns: list[Tally]
    total: Tally


def revision_operators() -> dict[int, int]:
    """kernel revision id -> id of its operator, for every revision."""
    return dict(KernelRevision.objects.values_list("id", "operator_id"))


def revisions_read() -> tuple[dict[int, int], revisions.CurrentMap]:
    """(revision id -> its operator's id, (operator id, backend) -> the
    revision current there), in one query: a revision comes once per
    backend it is current on."""
    operators_of: dict[int, int] = {}
    current: revisions.CurrentMap = {}
    for pk, op, backend in KernelRevision.objects.values_list(
        "id", "operator_id", "current_on__backend"
    ):
        operators_of[pk] = op
        if backend:
            current[op, backend] = pk
    return operators_of, current


def cell_groups(
    filters: MatrixFilters,
    device_types: list[DeviceType],
    operators_of: dict[int, int] | None = None,
):
    """(operator id, revision id, device type id, status, count) over the
    latest result of every cell: one grouped query on Cell alone. The
    operator of each revision comes from ``operators_of`` (read again when
    a revision is missing from it), device types are filtered in SQL only
    under a backend filter."""
    if filters.toolchain is None or not device_types:
        return []
    columns = [d.id for d in device_types] if filters.backend else None
    return with_operators(cell_group_rows(filters, columns), operators_of)


def cell_group_rows(filters: MatrixFilters, columns: list[int] | None = None):
    """(device type id, revision id, status, count) over the cells of
    ``filters.toolchain`` (which must be set), in the device type columns
    ``columns`` (None: every column). Shape is joined only when a shape
    filter asks for it: without the join and the 50-id filter the
    aggregate takes about half the time."""
    cells = Cell.objects.filter(filters.shape_q("shape__"), toolchain=filters.toolchain)
    if columns is not None:
        cells = cells.filter(device_type_id__in=columns)
    # COUNT(*), not of ids, grouped in the cell_tally index's order: the
    # index answers it alone, without visiting the table or sorting (an
    # index-only scan: 7 ms for 31,000 cells, 0.6 ms for one column of them).
    groups = (
        cells.values_list("device_type_id", "revision_id", "status")
        .annotate(n=Count("*"))
        .order_by()
    )
    # Thousands of small rows, fetched as plain tuples: the ORM's per-row
    # machinery added a millisecond on the benchmark's 10,000 cells.
    sql, params = groups.query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


def with_operators(rows, operators_of: dict[int, int] | None = None) -> list:
    """``cell_group_rows`` as ``cell_groups`` returns them, each with its
    revision's operator."""
    if operators_of is None or any(row[1] not in operators_of for row in rows):
        operators_of = revision_operators()
    return [(operators_of[rev], rev, dt, status, n) for dt, rev, status, n in rows]


def column_versions(toolchain_id: int) -> dict[int, int | None]:
    """Device type id -> the newest result id of its column on the
    toolchain, for every device type, in one query of index lookups
    (``result_column_newest``): a result moves its own column's alone."""
    result, device_type = (
        connection.ops.quote_name(model._meta.db_table)
        for model in (Result, DeviceType)
    )
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT d.id, (SELECT MAX(r.id) FROM {result} r"
            " WHERE r.device_type_id = d.id AND r.toolchain_id = %s)"
            f" FROM {device_type} d",
            [toolchain_id],
        )
        return dict(cursor.fetchall())


def operator_list(filters: MatrixFilters) -> list[Operator]:
    """Operators, each with ``shape_count`` (its shapes under the filters)."""
    shape_q = filters.shape_q("shapes__")
    # By name, said here: a grouped query does not take Meta.ordering, and
    # PostgreSQL then returns its groups in any order.
    return list(
        Operator.objects.only("id", "name", "dims")
        .annotate(
            shape_count=Count("shapes", filter=shape_q or None),
        )
        .order_by("name")
    )


def issued_time(issued_at: str | None, recorded_at: datetime) -> datetime:
    """When a result was produced: the time its runner signed it (its
    receipt's ``issued_at``), not when this server stored it, which for
    imported evidence is the day of the import. ``recorded_at`` stands in
    for a result that came without a signed envelope."""
    if issued_at:
        try:
            moment = datetime.fromisoformat(issued_at)
        except ValueError:
            return recorded_at
        if moment.tzinfo is not None:
            return moment
    return recorded_at


def result_time(result: Result) -> datetime:
    """``issued_time`` of a Result read with ``select_related("receipt")``."""
    receipt = getattr(result, "receipt", None)
    return issued_time(receipt.issued_at if receipt else None, result.created_at)


def cells_version() -> int | None:
    """Changes whenever any cell can have changed: ingest writes a Result
    before it points a Cell at it, so the newest result id moves with every
    cell update. One lookup at the end of Result's primary-key index, not a
    scan; cells removed by cascade change the catalogue, which the callers
    key on separately."""
    # In SQL: the ORM's aggregate machinery cost more than the lookup, on
    # every view of every cached page.
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT MAX(id) FROM {connection.ops.quote_name(Result._meta.db_table)}"
        )
        return cursor.fetchone()[0]


def matrix_summary(
    filters: MatrixFilters,
    device_types: list[DeviceType],
    current: revisions.CurrentMap,
    operators: list[Operator],
    groups=None,
) -> MatrixSummary:
    """One row per operator with per-device-type tallies from one grouped
    query over Cell, whatever the size of the matrix. ``groups`` replaces
    that query, so a benchmark can compare sources."""
    dt_index = {d.id: i for i, d in enumerate(device_types)}
    dt_backend = {d.id: d.backend for d in device_types}
    grid: dict[int, list[Tally]] = {
        op.id: [Tally() for _ in device_types] for op in operators
    }
    # Cells with a result per operator × device type, matching the status
    # filter or not: the rest of its shapes were never run.
    ran: dict[int, list[int]] = {op.id: [0] * len(device_types) for op in operators}
    if groups is None:
        groups = cell_groups(filters, device_types)
    for op_id, rev_id, dt_id, status, n in groups:
        # An operator or device type newer than the (briefly cached)
        # catalogue, or a column the backend filter hides, is not drawn.
        if op_id not in grid or dt_id not in dt_index:
            continue
        i = dt_index[dt_id]
        ran[op_id][i] += n
        stale = filters.toolchain_stale or rev_id != current.get(
            (op_id, dt_backend[dt_id])
        )
        if matches(filters.status, status, stale):
            # Under the stale filter a tally counts stale cells whatever
            # their status.
            grid[op_id][i].add(STALE if filters.status == STALE else status, n, stale)
    never_run_counted = matches(filters.status, EMPTY, False)
    columns = [Tally() for _ in device_types]
    total = Tally()
    rows = []
    for op in operators:
        tally = Tally()
        for i, t in enumerate(grid[op.id]):
            missing = op.shape_count - ran[op.id][i]
            if missing > 0 and never_run_counted:
                t.add(EMPTY, missing, False)
            tally.merge(t)
        # No shapes, no device types or no cell in the filtered state:
        # nothing to draw for this operator.
        if not tally.total:
            continue
        for i, t in enumerate(grid[op.id]):
            columns[i].merge(t)
        total.merge(tally)
        rows.append(OperatorRow(op, op.shape_count, grid[op.id], tally))
    return MatrixSummary(device_types, rows, columns, total)


@dataclass(slots=True)
class MatrixCell:
    """One cell of a shape row (the row holds the shape)."""

    device_type_id: int
    status: str
    stale: bool
    kernel_ms: float | None
    reference_ms: float | None
    dimmed: bool

    @property
    def kind(self) -> str:
        return status_kind(self.status)

    @property
    def label(self) -> tuple[str, str, str]:
        return state_label(self.status)

    @property
    def speedup(self) -> float | None:
        if self.kernel_ms and self.reference_ms:
            return self.reference_ms / self.kernel_ms
        return None


@dataclass
class ShapeRow:
    shape: Shape
    cells: list[MatrixCell]
    passing: int
    total: int


def operator_rows(
    operator: Operator,
    filters: MatrixFilters,
    device_types: list[DeviceType],
    current: revisions.CurrentMap,
    limit: int,
) -> tuple[list[ShapeRow], int]:
    """Shape × dtype rows of one operator, served first by weight, with one
    cell per device type; at most ``limit`` rows, and how many more match.
    Two queries, three when there are more."""
    tc = filters.toolchain
    dt_ids = [d.id for d in device_types]
    matching = Shape.objects.filter(filters.shape_q(), operator=operator)
    if filters.status and tc is not None:
        matching = matching.filter(
            _row_status_q(filters, operator, device_types, current)
        )
    elif filters.status and filters.status != EMPTY:
        matching = matching.none()
    shapes = list(matching.by_weight()[: limit + 1])
    left = matching.count() - limit if len(shapes) > limit else 0
    shapes = shapes[:limit]
    found: dict[tuple[int, int], tuple] = {}
    if tc is not None and shapes and dt_ids:
        for row in Cell.objects.filter(
            toolchain=tc, shape__in=shapes, device_type_id__in=dt_ids
        ).values_list(
            "shape_id",
            "device_type_id",
            "status",
            "revision_id",
            "kernel_ms",
            "reference_ms",
        ):
            found[row[0], row[1]] = row[2:]
    current_on = {d.id: current.get((operator.id, d.backend)) for d in device_types}
    # A cell never run reads the same in every row: one shared object per
    # column rather than thousands in a sparse matrix.
    empty_dimmed = not matches(filters.status, EMPTY, False)
    never_run = {
        dt_id: MatrixCell(dt_id, EMPTY, False, None, None, empty_dimmed)
        for dt_id in dt_ids
    }
    rows = []
    for shape in shapes:
        cells = []
        passing = 0
        for dt_id in dt_ids:
            hit = found.get((shape.id, dt_id))
            if hit is None:
                cells.append(never_run[dt_id])
                continue
            status, rev_id, kms, rms = hit
            stale = filters.toolchain_stale or rev_id != current_on[dt_id]
            passing += status == Status.PASS and not stale
            cells.append(
                MatrixCell(
                    dt_id,
                    status,
                    stale,
                    kms,
                    rms,
                    dimmed=not matches(filters.status, status, stale),
                )
            )
        rows.append(ShapeRow(shape, cells, passing, len(dt_ids)))
    return rows, left


def _row_status_q(
    filters: MatrixFilters,
    operator: Operator,
    device_types: list[DeviceType],
    current: revisions.CurrentMap,
) -> Q:
    """Rows with at least one cell in the filtered state, as SQL."""
    dt_ids = [d.id for d in device_types]
    cells = Cell.objects.filter(
        shape=OuterRef("pk"), toolchain=filters.toolchain, device_type_id__in=dt_ids
    )
    if filters.status == EMPTY:
        return ~Q(pk__in=complete_shapes(filters, dt_ids))
    if filters.status == STALE:
        if filters.toolchain_stale:
            return Q(Exists(cells))
        return Q(
            Exists(cells.filter(revisions.stale_q(current, operator.id, device_types)))
        )
    return Q(Exists(cells.filter(status=filters.status)))


def complete_shapes(filters: MatrixFilters, dt_ids: list[int]):
    """Shape ids with a cell on every one of ``dt_ids``."""
    return (
        Cell.objects.filter(toolchain=filters.toolchain, device_type_id__in=dt_ids)
        .values("shape_id")
        .annotate(n=Count("id"))
        .filter(n__gte=len(dt_ids))
        .values("shape_id")
    )


# --- runners -----------------------------------------------------------------


def toolchains_online() -> list[Toolchain]:
    """Toolchains that some online routable runner hosts."""
    from matrix.fleet.models import Runner

    return list(
        Toolchain.objects.filter(runners__in=Runner.objects.online())
        .distinct()
        .order_by("name")
    )


# --- error groups (their pages: matrix.error_groups) ------------------------


def signature_count(signature: str, toolchain: Toolchain) -> int:
    """Cells on ``toolchain`` with this signature, as the error groups of
    that toolchain count them."""
    if not signature:
        return 0
    return Cell.objects.filter(error_signature=signature, toolchain=toolchain).count()
