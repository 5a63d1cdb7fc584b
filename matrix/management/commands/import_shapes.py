"""Import served shapes from a built-in model profile or a captured trace."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from matrix import profiles
from matrix.models import Dtype, Operator, Shape, dims_key
from matrix.services import shape_import

SOURCE_PROFILE_MAX = Shape._meta.get_field("source_profile").max_length


def comma_list(text: str, option: str, convert=str) -> list:
    try:
        items = [convert(part.strip()) for part in text.split(",")]
    except ValueError:
        items = []
    if not items or "" in items:
        raise CommandError(f"{option}: expected a comma-separated list, got {text!r}")
    return items


def trace_rows(trace, path: str) -> list[tuple]:
    """(operator, dims, dtype, weight) per call of a trace, in its order, so
    shape_import's row N is the trace's call N. A shape called at several
    token counts gets the sum of its counts: calls per forward, over the
    token counts traced, as a profile's weights are."""
    if not isinstance(trace, dict) or not isinstance(trace.get("calls"), list):
        raise CommandError(
            f"{path}: not a trace: expected an object with a 'calls' list"
        )
    if not trace["calls"]:
        raise CommandError(f"{path}: the trace has no calls to import")
    keys, totals = [], Counter()
    for i, call in enumerate(trace["calls"], start=1):
        if not isinstance(call, dict):
            raise CommandError(f"{path}: call {i} is not an object")
        missing = [f for f in ("operator", "dims", "dtype", "count") if f not in call]
        if missing:
            raise CommandError(f"{path}: call {i} lacks {', '.join(missing)}")
        count = call["count"]
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise CommandError(f"{path}: call {i}: count must be a positive integer")
        if not isinstance(call["operator"], str):
            raise CommandError(f"{path}: call {i}: operator must be a name")
        key = json.dumps(
            [call["operator"], call["dims"], call["dtype"]], sort_keys=True
        )
        keys.append((key, call))
        totals[key] += count
    return [(c["operator"], c["dims"], c["dtype"], totals[key]) for key, c in keys]


def shape_states(operator_names) -> dict[tuple, tuple]:
    return {
        (op, key, dtype): (served, weight, source)
        for op, key, dtype, served, weight, source in Shape.objects.filter(
            operator__name__in=operator_names
        ).values_list(
            "operator__name", "dims_key", "dtype", "served", "weight", "source_profile"
        )
    }


class Command(BaseCommand):
    help = (
        "Import served shapes with their weights (calls per forward step) from a "
        "built-in model profile or from a trace written by `python -m "
        "runners.capture`. All rows are checked before any is written (a trace's "
        "row N is its call N); run it again and nothing changes."
    )

    def add_arguments(self, parser):
        source = parser.add_mutually_exclusive_group(required=True)
        source.add_argument("--profile", choices=sorted(profiles.PROFILES))
        source.add_argument("--trace", metavar="TRACE_JSON")
        parser.add_argument(
            "--tokens",
            help="profile only: token counts per forward step, default "
            + ",".join(map(str, profiles.TOKEN_COUNTS)),
        )
        parser.add_argument(
            "--dtypes",
            help="profile only: default " + ",".join(profiles.SERVED_DTYPES),
        )
        parser.add_argument(
            "--name",
            help="trace only: the source recorded on the shapes (default: its model)",
        )

    def handle(
        self,
        *args,
        profile=None,
        trace=None,
        tokens=None,
        dtypes=None,
        name=None,
        **options,
    ):
        if profile:
            if name:
                raise CommandError(
                    "--name applies to --trace; a profile is named by itself"
                )
            rows, source = self.profile_rows(profile, tokens, dtypes), profile
        else:
            if tokens or dtypes:
                raise CommandError(
                    "--tokens and --dtypes apply to --profile; a trace has its own"
                )
            rows, source, data = self.read_trace(trace, name)
        names = {row[0] for row in rows}
        before = shape_states(names)
        try:
            shape_import(rows=rows, source_profile=source, served=True)
        except ValidationError as exc:
            where = f"{trace}: " if trace else f"profile {profile}: "
            raise CommandError(
                where + "; ".join(exc.messages) + "; nothing imported"
            ) from None
        self.summarize(source, rows, before, shape_states(names))
        if trace:
            self.report_unmapped(data)

    def profile_rows(
        self, profile: str, tokens: str | None, dtypes: str | None
    ) -> list:
        token_counts = (
            comma_list(tokens, "--tokens", int)
            if tokens
            else list(profiles.TOKEN_COUNTS)
        )
        if min(token_counts) < 1 or len(set(token_counts)) != len(token_counts):
            # A repeated count would double its shapes' weights.
            raise CommandError("--tokens: token counts must be positive and distinct")
        dtype_names = (
            comma_list(dtypes, "--dtypes") if dtypes else list(profiles.SERVED_DTYPES)
        )
        unknown = sorted(set(dtype_names) - set(Dtype.values))
        if unknown:
            raise CommandError(
                f"--dtypes: unknown {unknown}; expected some of {Dtype.values}"
            )
        return list(
            profiles.served_shapes(profile, tokens=token_counts, dtypes=dtype_names)
        )

    def read_trace(self, path: str, name: str | None):
        try:
            data = json.loads(Path(path).read_text())
        except OSError as exc:
            raise CommandError(f"{path}: cannot read: {exc.strerror}") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise CommandError(f"{path}: not JSON: {exc}") from None
        rows = trace_rows(data, path)
        source = name or data.get("model")
        if not isinstance(source, str) or not source:
            raise CommandError(f"{path}: the trace names no model; pass --name")
        if len(source) > SOURCE_PROFILE_MAX:
            raise CommandError(
                f"source name {source[:40]!r}... is over {SOURCE_PROFILE_MAX} characters; "
                "pass a shorter --name"
            )
        return rows, source, data

    def summarize(self, source: str, rows: list, before: dict, after: dict) -> None:
        names = {row[0] for row in rows}
        operators = {op.name: op for op in Operator.objects.filter(name__in=names)}
        tally: dict[str, Counter] = {}
        seen = set()
        for op_name, dims, dtype, _ in rows:
            key = (op_name, dims_key(operators[op_name].clean_dims(dims)), dtype)
            if key in seen:
                continue
            seen.add(key)
            if key not in before:
                outcome = "created"
            elif before[key] != after[key]:
                outcome = "updated"
            else:
                outcome = "unchanged"
            tally.setdefault(op_name, Counter())[outcome] += 1
        total = Counter()
        for counts in tally.values():
            total.update(counts)
        self.stdout.write(
            f"{source}: {len(seen)} shapes: {total['created']} created, "
            f"{total['updated']} updated, {total['unchanged']} unchanged"
        )
        self.stdout.write(
            f"  {'operator':<20} {'created':>8} {'updated':>8} {'unchanged':>10}"
        )
        for op_name in sorted(tally):
            c = tally[op_name]
            self.stdout.write(
                f"  {op_name:<20} {c['created']:>8} {c['updated']:>8} {c['unchanged']:>10}"
            )

    def report_unmapped(self, trace: dict) -> None:
        unmapped = Counter()
        for entry in trace.get("unmapped") or []:
            count = entry.get("count") if isinstance(entry, dict) else None
            if isinstance(count, int):
                unmapped[(str(entry.get("op")), str(entry.get("reason")))] += count
        for (op, reason), count in sorted(unmapped.items()):
            self.stdout.write(f"  not imported: {count} call(s) of {op}: {reason}")
