"""Reads during steady ingest: bench/load.py's ``steady`` part.

While the real control worker (``manage.py control work``) ingests a steady
stream of signed results (``--steady-rate`` a second, in messages of 5 to 25
as runners send them, spread over the current toolchain's device types),
readers ask for generated URLs, never a fixed list: ``--steady-pool``
addresses per kind of read, generated from what the database holds and
drawn by rank (weights 1/rank: a few read often, a long tail rarely, as
readers do), of: the matrix under random
filters (toolchain, device type, operator, dtype, backend, status, an
operator opened, now and then free text), gaps pages and their page
numbers, cells of every toolchain, error groups, the Models page and API,
the API's matrix and gaps under random filters and deep in their cursor
chains, the manifest of each device type. Measured:

- each kind of read alone, one request at a time: p50, p95, errors;
- the manifest with its cache just emptied (its keys deleted and each web
  process's near copy expired) before each request, answered from its
  snapshot in the database; and rebuilt, its snapshots deleted too (the
  first read after an approval);
- 50 connections (wrk) over thousands of generated URLs: p95, errors;
- the cache's hit rate over each part, from /metrics
  (``tilematrix_read_answers``: hit and earlier over all whole answers);
- ingest: the rate reached, and the lag from a message's sending to its
  results' storage (the receipt's ``received_at``), p50, p95 and max, and
  what was not stored when the stream stopped.
"""

from __future__ import annotations

import json
import random
import statistics
import tempfile
import time
import urllib.parse
from pathlib import Path

from load_web import percentile, wrk

KINDS = (
    "home",
    "gaps",
    "cell",
    "errors",
    "models",
    "api_matrix",
    "api_matrix_deep",
    "api_gaps",
    "api_gaps_deep",
    "api_models",
    "api_manifest",
)
GOAL_P95_MS = 50
GOAL_HIT_RATE = 0.9
GOAL_MIXED_P95_MS = 300
# The manifest's keys are deleted, then each web process's near copy
# (matrix.cache.NEAR_S) is left to expire before the request.
NEAR_EXPIRY_S = 2.1


class UrlSpace:
    """Generated reader URLs over what the database holds."""

    def __init__(self, client, rng: random.Random):
        from django.db.models import Max

        from matrix.models import (
            Cell,
            DeviceType,
            Operator,
            ServedCall,
            Shape,
            Toolchain,
        )

        self.rng = rng
        self.client = client
        self.toolchains = list(Toolchain.objects.values_list("name", flat=True))
        self.current = Toolchain.objects.get(is_current=True).name
        self.device_types = list(DeviceType.objects.all())
        self.operators = list(Operator.objects.values_list("name", flat=True))
        self.models = sorted(set(ServedCall.objects.values_list("source", flat=True)))
        self.dtypes = sorted(set(Shape.objects.values_list("dtype", flat=True)))
        self.backends = sorted({d.backend for d in self.device_types})
        # Every filter value the pages and the API take (queries.STATE_FILTERS).
        self.statuses = ["pass", "compile_error", "mismatch", "runtime_error"]
        self.statuses += ["timeout", "unsupported", "lowered", "empty", "stale"]
        # Cells of every toolchain, a few thousand drawn at random by id.
        top = Cell.objects.aggregate(n=Max("id"))["n"] or 0
        ids = [rng.randint(1, top) for _ in range(4000)]
        names = dict(Toolchain.objects.values_list("pk", "name"))
        self.cells = [
            (s, d, names[t])
            for s, d, t in Cell.objects.filter(pk__in=ids).values_list(
                "shape_id", "device_type_id", "toolchain_id"
            )
        ]
        self.deep: dict[str, list[str]] = {"api_matrix": [], "api_gaps": []}

    def _toolchain(self) -> str:
        # Most readers look at the current toolchain, as the pages default.
        return (
            self.current
            if self.rng.random() < 0.6
            else self.rng.choice(self.toolchains)
        )

    def _filters(self, *, status=True, device=True) -> dict:
        rng, params = self.rng, {"toolchain": self._toolchain()}
        if device and rng.random() < 0.35:
            params["device"] = rng.choice(self.device_types).pk
        elif rng.random() < 0.2:
            params["backend"] = rng.choice(self.backends)
        if rng.random() < 0.3:
            params["operator"] = rng.choice(self.operators)
        if rng.random() < 0.25:
            params["dtype"] = rng.choice(self.dtypes)
        if status and rng.random() < 0.3:
            params["status"] = rng.choice(self.statuses)
        if self.models and rng.random() < 0.15:
            params["model"] = rng.choice(self.models)
        return params

    def url(self, kind: str) -> str:
        rng = self.rng
        if kind == "home":
            params = self._filters()
            if rng.random() < 0.3:
                params["open"] = rng.choice(self.operators)
            if rng.random() < 0.05:
                params["q"] = f"M={rng.choice([1, 16, 128, 4096])},"
            return "/?" + urllib.parse.urlencode(params)
        if kind == "gaps":
            params = self._filters(status=False)
            params["toolchain"] = self.current
            if rng.random() < 0.4:
                params["page"] = rng.randint(2, 12)
            return "/gaps/?" + urllib.parse.urlencode(params)
        if kind == "cell":
            shape, device, toolchain = rng.choice(self.cells)
            return f"/cells/{shape}/{device}/?toolchain={toolchain}"
        if kind == "errors":
            return "/errors/?toolchain=" + urllib.parse.quote(self._toolchain())
        if kind == "models":
            params = {"toolchain": self._toolchain()}
            if rng.random() < 0.5:
                params["model"] = rng.choice(self.models)
            return "/models/?" + urllib.parse.urlencode(params)
        if kind == "api_models":
            params = {"toolchain": self._toolchain()}
            if rng.random() < 0.5:
                params["model"] = rng.choice(self.models)
            return "/api/v1/models?" + urllib.parse.urlencode(params)
        if kind == "api_matrix":
            params = self._filters()
            params["limit"] = rng.choice([100, 500])
            return "/api/v1/matrix?" + urllib.parse.urlencode(params)
        if kind == "api_gaps":
            params = self._filters(status=False)
            params["limit"] = rng.choice([100, 500])
            return "/api/v1/gaps?" + urllib.parse.urlencode(params)
        if kind in ("api_matrix_deep", "api_gaps_deep"):
            found = self.deep[kind.removesuffix("_deep")]
            if found:
                return rng.choice(found)
            return self.url(kind.removesuffix("_deep"))
        if kind == "api_manifest":
            params = {}
            if rng.random() < 0.8:
                params["device_type"] = str(rng.choice(self.device_types))
            return "/api/v1/manifest?" + urllib.parse.urlencode(params)
        raise ValueError(kind)

    def walk_cursors(self, chains: int = 6, depth: int = 40) -> dict:
        """Follow ``next`` down a few generated chains of the API's matrix
        and gaps, keeping each page's address: deep pages to read again
        under ingest. Returns the deepest page reached per chain."""
        reached = {}
        for kind in self.deep:
            for _ in range(chains):
                url = self.url(kind)
                for step in range(depth):
                    status, body, _ = self.client.get(url)
                    if status != 200:
                        break
                    following = json.loads(body).get("next")
                    if not following:
                        break
                    url = next_url(url, following)
                    self.deep[kind].append(url)
                    reached[kind] = max(reached.get(kind, 0), step + 1)
        return reached


def next_url(url: str, following: str) -> str:
    """The page after ``url``: the gaps give the next page's address, the
    matrix its cursor alone."""
    if following.startswith(("http:", "https:", "/")):
        parts = urllib.parse.urlsplit(following)
        return parts.path + "?" + parts.query
    parts = urllib.parse.urlsplit(url)
    params = dict(urllib.parse.parse_qsl(parts.query))
    params["cursor"] = following
    return parts.path + "?" + urllib.parse.urlencode(params)


def zipf_draw(rng: random.Random, pool: list[str], k: int) -> list[str]:
    """``k`` draws from ``pool`` with weights 1/rank: a few addresses read
    often (the default views, bookmarked filters), a long tail rarely."""
    weights = [1 / (rank + 1) for rank in range(len(pool))]
    return rng.choices(pool, weights=weights, k=k)


class SteadyIngest:
    """Signed results sent at ``rate`` a second, in messages of 5 to 25, over
    the current toolchain's device types in turn, for at most ``max_s``.

    A process of its own (forked) makes the jobs, signs their results and
    sends them, a couple of seconds ahead of the stream, as a fleet's
    runners would: the jobs open at any time are the few seconds' worth a
    fleet has in flight, not the whole run's, and the signing takes no time
    from the timed reader's process."""

    AHEAD_S = 2.0
    CHUNK = 250

    def __init__(self, fixture, rate: float, max_s: float):
        import multiprocessing

        self.fixture, self.rate, self.max_s = fixture, rate, max_s
        self.context = multiprocessing.get_context("fork")
        self.stop = self.context.Event()
        self.out = tempfile.NamedTemporaryFile("w+", suffix=".json", delete=False)
        self.sent_at: dict[int, float] = {}
        self.started = self.stopped = None
        self.prepared = 0

    def _feed(self) -> None:
        """The child: prepare, pace and send; write what was sent when."""
        from django.db import connections

        from matrix.models import DeviceType
        from runners import host

        connections.close_all()
        columns = list(DeviceType.objects.order_by("id"))
        fixture, rate = self.fixture, self.rate
        started = time.time()
        sent_at: dict[int, float] = {}
        queue: list[list] = []
        prepared = sent = turn = 0
        while not self.stop.is_set() and time.time() - started < self.max_s:
            if prepared - sent < rate * self.AHEAD_S:
                column = columns[turn % len(columns)]
                turn += 1
                queue += fixture.messages(
                    self.CHUNK, device_type=column, toolchain=fixture.current
                )
                prepared += self.CHUNK
                continue
            due = started + sent / rate
            wait = due - time.time()
            if wait > 0 and self.stop.wait(min(wait, 0.05)):
                break
            if wait > 0.05:
                continue
            message = queue.pop(0)
            now = time.time()
            host.results_send(message)
            for envelope in message:
                sent_at[envelope["payload"]["job"]] = now
            sent += len(message)
        json.dump(
            {
                "started": started,
                "stopped": time.time(),
                "prepared": prepared,
                "sent_at": sent_at,
            },
            open(self.out.name, "w"),
        )
        connections.close_all()

    def __enter__(self):
        from django.db import connections

        # The child makes its own connections: none is shared across fork.
        connections.close_all()
        self.process = self.context.Process(target=self._feed, daemon=True)
        self.process.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.process.join(timeout=120)
        if self.process.is_alive():
            self.process.kill()
        fed = json.loads(Path(self.out.name).read_text() or "{}")
        self.sent_at = {int(k): v for k, v in fed.get("sent_at", {}).items()}
        self.started, self.stopped = fed.get("started"), fed.get("stopped")
        self.prepared = fed.get("prepared", 0)

    def report(self, drain_s: float) -> dict:
        """Stored results of what was sent, waiting up to ``drain_s`` for
        the rest: the rate reached and the lag, sending to storage."""
        from matrix.fleet.models import Receipt

        sent = dict(self.sent_at)
        deadline = time.monotonic() + drain_s
        backlog_at_stop = None
        while True:
            # By the range of the jobs' ids (made for the stream, in a row):
            # a list of them passes PostgreSQL's 65,535 parameters.
            stored = {
                job: at
                for job, at in Receipt.objects.filter(
                    result__job_id__gte=min(sent, default=0),
                    result__job_id__lte=max(sent, default=0),
                ).values_list("result__job_id", "received_at")
                if job in sent
            }
            if backlog_at_stop is None:
                backlog_at_stop = len(sent) - len(stored)
            if len(stored) >= len(sent) or time.monotonic() > deadline:
                break
            time.sleep(1.0)
        lags = [stored[j].timestamp() - sent[j] for j in stored]
        window = (self.stopped or time.time()) - (self.started or time.time())
        in_window = sum(
            1 for j in stored if stored[j].timestamp() <= (self.stopped or 0)
        )
        return {
            "target_per_s": self.rate,
            "sent": len(sent),
            "prepared": self.prepared,
            "seconds": round(window, 1),
            "sent_per_s": round(len(sent) / window, 1) if window else None,
            "stored_per_s_while_sending": round(in_window / window, 1)
            if window
            else None,
            "stored": len(stored),
            "not_stored_at_stop": backlog_at_stop,
            "not_stored_after_drain": len(sent) - len(stored),
            "lag_p50_s": round(statistics.median(lags), 2) if lags else None,
            "lag_p95_s": round(percentile(lags, 0.95), 2) if lags else None,
            "lag_max_s": round(max(lags), 2) if lags else None,
        }


def read_answers(client, token: str) -> dict[str, float]:
    """``tilematrix_read_answers`` from /metrics, by outcome."""
    from prometheus_client.parser import text_string_to_metric_families

    status, body, _ = client.get("/metrics", {"Authorization": f"Bearer {token}"})
    if status != 200:
        raise SystemExit(f"/metrics answered {status}: {body[:200]!r}")
    return {
        sample.labels["outcome"]: sample.value
        for family in text_string_to_metric_families(body.decode())
        for sample in family.samples
        if sample.name == "tilematrix_read_answers_total"
    }


def hit_rate(before: dict, after: dict) -> dict:
    moved = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    total = sum(moved.values())
    kept = moved.get("hit", 0) + moved.get("earlier", 0)
    return {
        "answers": {k: int(v) for k, v in moved.items()},
        "hit_rate": round(kept / total, 3) if total else None,
    }


def warm(client, urls: list[str], threads: int = 3) -> dict:
    """GET each address once, ``threads`` at a time; statuses counted."""
    from concurrent.futures import ThreadPoolExecutor

    from load_web import Client

    def get(url: str) -> int:
        reader = Client(client.port)
        reader.cookies = dict(client.cookies)
        return reader.get(url)[0]

    statuses: dict[int, int] = {}
    with ThreadPoolExecutor(threads) as pool:
        for status in pool.map(get, urls):
            statuses[status] = statuses.get(status, 0) + 1
    return {"urls": len(urls), "statuses": statuses}


def timed(client, url: str) -> tuple[float, int]:
    started = time.perf_counter()
    status, _, _ = client.get(url)
    return (time.perf_counter() - started) * 1000, status


def summary(samples: list[float], statuses: dict, urls: int) -> dict:
    errors = sum(n for status, n in statuses.items() if status != 200)
    return {
        "requests": len(samples),
        "distinct_urls": urls,
        "p50_ms": round(statistics.median(samples), 1) if samples else None,
        "p95_ms": round(percentile(samples, 0.95), 1) if samples else None,
        "max_ms": round(max(samples), 1) if samples else None,
        "errors": errors,
        "statuses": statuses,
    }


def manifest_emptied(
    client, redis_url: str, trials: int, *, snapshots: bool = True
) -> dict:
    """GET /api/v1/manifest right after its cache was emptied, ``trials``
    times (the whole manifest, gzipped as clients take it): answered from
    its snapshot in the database, or with ``snapshots=False`` (those
    deleted too) built again, as the first read after an approval is."""
    import redis

    from matrix.models import ManifestSnapshot

    store = redis.Redis.from_url(redis_url)
    samples, statuses = [], {}
    for _ in range(trials):
        for key in store.scan_iter("*api-manifest*"):
            store.delete(key)
        if not snapshots:
            ManifestSnapshot.objects.all().delete()
        time.sleep(NEAR_EXPIRY_S)
        ms, status = timed(client, "/api/v1/manifest")
        samples.append(ms)
        statuses[status] = statuses.get(status, 0) + 1
    return summary(samples, statuses, 1)


def run(client, fixture, worker_class, port: int, args, token: str) -> dict:
    """The steady part, as bench/load.py's child runs it."""
    seed = args.steady_seed if args.steady_seed is not None else time.time_ns()
    rng = random.Random(seed)
    space = UrlSpace(client, rng)
    out = {"url_seed": seed, "cells_sampled": len(space.cells)}
    started = time.perf_counter()
    out["deepest_pages"] = space.walk_cursors()
    out["cursor_walk_s"] = round(time.perf_counter() - started, 1)
    # Each kind's addresses, generated; reads draw from them by rank.
    pools = {
        kind: list(dict.fromkeys(space.url(kind) for _ in range(args.steady_pool)))
        for kind in KINDS
    }
    out["pool_sizes"] = {kind: len(pool) for kind, pool in pools.items()}
    ingest = SteadyIngest(fixture, args.steady_rate, args.steady_max_s)
    rows: dict[str, dict] = {}
    # The first addresses answered otherwise than 200, to tell why.
    refused: list = []
    out["not_200"] = refused
    with worker_class() as worker:
        with ingest:
            # Under ingest from here. Every address of the pools once first,
            # as a server that has been up has met them (three at a time,
            # one per web worker): the hit rate is then what the versions'
            # churn leaves, not a cold start.
            started = time.perf_counter()
            out["warm_pass"] = warm(client, [u for p in pools.values() for u in p])
            out["warm_pass"]["seconds"] = round(time.perf_counter() - started, 1)
            say(f"steady warm pass: {out['warm_pass']}")
            before = read_answers(client, token)
            for kind in KINDS:
                samples, statuses, urls = [], {}, set()
                deadline = time.monotonic() + args.row_budget_s
                draws = iter(zipf_draw(rng, pools[kind], 10 * args.steady_requests))
                while len(samples) < args.steady_requests and (
                    time.monotonic() < deadline or len(samples) < 3
                ):
                    url = next(draws)
                    urls.add(url)
                    ms, status = timed(client, url)
                    samples.append(ms)
                    statuses[status] = statuses.get(status, 0) + 1
                    if status != 200 and len(refused) < 20:
                        refused.append([status, url])
                rows[kind] = summary(samples, statuses, len(urls))
                say(f"steady {kind}: {rows[kind]}")
            out["reads_hit_rate"] = hit_rate(before, read_answers(client, token))
            rows["api_manifest_emptied"] = manifest_emptied(
                client, args.redis, args.steady_manifest_trials
            )
            say(f"steady manifest emptied: {rows['api_manifest_emptied']}")
            rows["api_manifest_rebuilt"] = manifest_emptied(
                client, args.redis, args.steady_manifest_trials, snapshots=False
            )
            say(f"steady manifest rebuilt: {rows['api_manifest_rebuilt']}")
            # The pools of every kind in one, each kind's Zipf-drawn.
            share = max(1, args.steady_urls // len(KINDS))
            mix = [u for kind in KINDS for u in zipf_draw(rng, pools[kind], share)]
            rng.shuffle(mix)
            before = read_answers(client, token)
            out["mixed"] = wrk(client, mix, args.connections, args.steady_load_s, port)
            out["mixed"]["distinct_urls"] = len(set(mix))
            out["mixed"]["connections"] = args.connections
            out["mixed_hit_rate"] = hit_rate(before, read_answers(client, token))
            say(f"steady mixed: {out['mixed']}")
        out["ingest"] = ingest.report(drain_s=60)
        say(f"steady ingest: {out['ingest']}")
        out["worker_log_tail"] = worker.log_tail()
    out["reads"] = rows
    out["verdicts"] = verdicts(out)
    return out


def verdicts(out: dict) -> dict:
    reads = out["reads"]
    return {
        "every_read_p95": all(
            r["p95_ms"] is not None and r["p95_ms"] <= GOAL_P95_MS
            for r in reads.values()
        ),
        "no_read_errors": all(r["errors"] == 0 for r in reads.values()),
        "hit_rate": (out["reads_hit_rate"]["hit_rate"] or 0) >= GOAL_HIT_RATE,
        "mixed": out["mixed"]["p95_ms"] <= GOAL_MIXED_P95_MS
        and out["mixed"]["errors"] == 0,
        "ingest_rate": (out["ingest"]["stored_per_s_while_sending"] or 0)
        >= 0.95 * out["ingest"]["target_per_s"],
    }


def print_table(size: str, out: dict) -> None:
    print(f"reads during steady ingest, {size} results")
    print(f"{'read (varied URLs)':<34}{'n':>6}{'urls':>6}{'p50':>8}{'p95':>8}"
          f"{'max':>8}{'errors':>8}   goal p95 ≤ {GOAL_P95_MS} ms")  # fmt: skip
    for kind, row in out["reads"].items():
        print(
            f"{kind:<34}{row['requests']:>6}{row['distinct_urls']:>6}"
            f"{row['p50_ms']:>8g}{row['p95_ms']:>8g}{row['max_ms']:>8g}"
            f"{row['errors']:>8}"
        )
    mixed = out["mixed"]
    rates = (out["reads_hit_rate"]["hit_rate"], out["mixed_hit_rate"]["hit_rate"])
    print(
        f"cache hit rate, reads one at a time: {rates[0]}; under "
        f"{mixed['connections']} connections: {rates[1]} (goal ≥ {GOAL_HIT_RATE})"
    )
    print(
        f"{mixed['connections']} connections over {mixed['distinct_urls']} URLs: "
        f"p95 {mixed['p95_ms']:g} ms, {mixed['errors']} errors, "
        f"{mixed['requests_per_s']:g} requests/s (goal p95 ≤ {GOAL_MIXED_P95_MS}, 0)"
    )
    ingest = out["ingest"]
    print(
        f"ingest: target {ingest['target_per_s']:g}/s, sent {ingest['sent_per_s']}/s, "
        f"stored {ingest['stored_per_s_while_sending']}/s while sending; lag p50 "
        f"{ingest['lag_p50_s']} s, p95 {ingest['lag_p95_s']} s, max "
        f"{ingest['lag_max_s']} s; not stored at stop {ingest['not_stored_at_stop']}"
        f", after draining {ingest['not_stored_after_drain']}"
    )
    print(f"verdicts: {out['verdicts']}")


def say(text: str) -> None:
    import sys

    print(text, file=sys.stderr, flush=True)
