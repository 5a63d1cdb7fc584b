"""Import served shapes from a built-in model profile or a captured trace."""

from __future__ import annotations

from collections import Counter

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from matrix import profiles
from matrix.management.commands._files import read_json
from matrix.management.commands._options import not_empty
from matrix.models import Dtype, Operator, Shape, dims_key
from matrix.services import DIM_MAX, served_model_remove, shape_import

SOURCE_PROFILE_MAX = Shape._meta.get_field("source_profile").max_length
# Calls of one shape in one forward step; far past any model's.
COUNT_MAX = 2**31 - 1


def is_name(value) -> bool:
    """A non-empty string PostgreSQL can store (it refuses NUL characters)."""
    return isinstance(value, str) and value != "" and "\x00" not in value


def is_count(value) -> bool:
    return (
        isinstance(value, int)
        and not isinstance(value, bool)
        and 1 <= value <= COUNT_MAX
    )


def comma_list(text: str, option: str, convert=str) -> list:
    try:
        items = [convert(part.strip()) for part in text.split(",")]
    except ValueError:
        items = []
    if not items or "" in items:
        raise CommandError(f"{option}: expected a comma-separated list, got {text!r}")
    return items


def trace_rows(trace, path: str) -> list[tuple]:
    """(operator, dims, dtype, count, tokens) per call of a trace, in its
    order, so shape_import's row N is the trace's call N. A shape called at
    several token counts gets the sum of its counts (calls per forward, over
    the token counts traced, as a profile's weights are), and each model
    keeps its count per token count. A call that does not say its token
    count (an older trace) is recorded under 0."""
    if not isinstance(trace, dict) or not isinstance(trace.get("calls"), list):
        raise CommandError(
            f"{path}: not a trace: expected an object with a 'calls' list"
        )
    if not trace["calls"]:
        raise CommandError(f"{path}: the trace has no calls to import")
    rows = []
    for i, call in enumerate(trace["calls"], start=1):
        if not isinstance(call, dict):
            raise CommandError(f"{path}: call {i} is not an object")
        missing = [f for f in ("operator", "dims", "dtype", "count") if f not in call]
        if missing:
            raise CommandError(f"{path}: call {i} lacks {', '.join(missing)}")
        if not is_count(call["count"]):
            raise CommandError(
                f"{path}: call {i}: count must be an integer from 1 to {COUNT_MAX}"
            )
        if not is_name(call["operator"]):
            raise CommandError(f"{path}: call {i}: operator must be a name")
        tokens = call.get("tokens", 0)
        if tokens != 0 and not is_count(tokens):
            raise CommandError(
                f"{path}: call {i}: tokens must be an integer from 1 to {COUNT_MAX}"
            )
        rows.append(
            (call["operator"], call["dims"], call["dtype"], call["count"], tokens)
        )
    return rows


def trace_unmapped(trace: dict, path: str) -> Counter:
    """Calls per (aten op, reason) the trace could not map to an operator,
    summed over its token counts. Checked with the calls, before anything is
    written: a count that cannot be read would hide calls from the report."""
    entries = trace.get("unmapped")
    if entries is None:
        return Counter()
    if not isinstance(entries, list):
        raise CommandError(f"{path}: 'unmapped' must be a list")
    unmapped = Counter()
    for i, entry in enumerate(entries, start=1):
        if not isinstance(entry, dict):
            raise CommandError(f"{path}: unmapped {i} is not an object")
        if not is_name(entry.get("op")) or not is_name(entry.get("reason")):
            raise CommandError(f"{path}: unmapped {i}: op and reason must be names")
        if not is_count(entry.get("count")):
            raise CommandError(
                f"{path}: unmapped {i}: count must be an integer from 1 to {COUNT_MAX}"
            )
        unmapped[entry["op"], entry["reason"]] += entry["count"]
    return unmapped


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
        source.add_argument("--trace", metavar="TRACE_JSON", type=not_empty)
        source.add_argument(
            "--remove",
            metavar="MODEL",
            type=not_empty,
            help="stop serving a model: its calls go, and shapes no other model "
            "calls are no longer served (their results stay)",
        )
        parser.add_argument(
            "--tokens",
            type=not_empty,
            help="profile only: token counts per forward step, default "
            + ",".join(map(str, profiles.TOKEN_COUNTS)),
        )
        parser.add_argument(
            "--dtypes",
            type=not_empty,
            help="profile only: default " + ",".join(profiles.SERVED_DTYPES),
        )
        parser.add_argument(
            "--name",
            type=not_empty,
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
        remove=None,
        **options,
    ):
        if remove:
            try:
                called, unserved = served_model_remove(remove)
            except ValidationError as exc:
                raise CommandError("; ".join(exc.messages)) from None
            self.stdout.write(
                f"{remove}: removed; of the {called} shapes it called, {unserved} "
                "are no longer served and the rest keep the other models' calls"
            )
            return
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
            rows, source, unmapped = self.read_trace(trace, name)
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
            for (op, reason), count in sorted(unmapped.items()):
                self.stdout.write(f"  not imported: {count} call(s) of {op}: {reason}")

    def profile_rows(
        self, profile: str, tokens: str | None, dtypes: str | None
    ) -> list:
        token_counts = (
            comma_list(tokens, "--tokens", int)
            if tokens
            else list(profiles.TOKEN_COUNTS)
        )
        if (
            not 1 <= min(token_counts) <= max(token_counts) <= DIM_MAX
            # A repeated count would double its shapes' weights.
            or len(set(token_counts)) != len(token_counts)
        ):
            raise CommandError(
                f"--tokens: token counts must be positive and distinct, at most "
                f"{DIM_MAX}"
            )
        dtype_names = (
            comma_list(dtypes, "--dtypes") if dtypes else list(profiles.SERVED_DTYPES)
        )
        unknown = sorted(set(dtype_names) - set(Dtype.values))
        if unknown:
            raise CommandError(
                f"--dtypes: unknown {unknown}; expected some of {Dtype.values}"
            )
        # A repeated dtype would double its shapes' weights, as a repeated
        # token count would.
        repeated = sorted(name for name, n in Counter(dtype_names).items() if n > 1)
        if repeated:
            raise CommandError(f"--dtypes: each dtype once; repeated {repeated}")
        return list(
            profiles.served_calls(profile, tokens=token_counts, dtypes=dtype_names)
        )

    def read_trace(self, path: str, name: str | None):
        data = read_json(path)
        rows = trace_rows(data, path)
        unmapped = trace_unmapped(data, path)
        source = name or data.get("model")
        if not source:
            raise CommandError(f"{path}: the trace names no model; pass --name")
        if not is_name(source):
            raise CommandError(
                f"{path}: the source name must be text without NUL characters; "
                "pass another --name"
            )
        if len(source) > SOURCE_PROFILE_MAX:
            raise CommandError(
                f"source name {source[:40]!r}... is over {SOURCE_PROFILE_MAX} characters; "
                "pass a shorter --name"
            )
        return rows, source, unmapped

    def summarize(self, source: str, rows: list, before: dict, after: dict) -> None:
        names = {row[0] for row in rows}
        operators = {op.name: op for op in Operator.objects.filter(name__in=names)}
        tally: dict[str, Counter] = {}
        seen = set()
        for op_name, dims, dtype, *_ in rows:
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
