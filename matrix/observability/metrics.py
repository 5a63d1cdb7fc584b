"""/metrics: the application's own figures for Prometheus, computed from the
database (and the broker) when scraped.

Results are stored by the control worker and heartbeats recorded there,
while a scrape reaches one of several gunicorn workers: counters kept in a
process would miss them. Every figure is read at scrape time instead, each
with a query an index answers however many results are stored: the newest
result's id, a window of the newest receipts, the open jobs (queued or
running, a small part of all jobs), the runners, the approved proposals.
A part that fails (the database or the broker down) is left out and named
in ``tilematrix_scrape_part_ok``; the scrape still answers."""

from __future__ import annotations

import hmac
import logging
import math
from collections import defaultdict
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Count, Max, Min
from django.http import HttpResponse
from django.utils import timezone
from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeHistogramMetricFamily,
    GaugeMetricFamily,
)
from prometheus_client.exposition import choose_encoder
from prometheus_client.utils import floatToGoString

from matrix.cache import answers_counted
from matrix.models import DeviceType, JobState, Result, Sweep, ValidationJob
from matrix.models.gate import ProposalState, UpgradeProposal
from matrix.models.notifications import Channel, DeliveryAttempt
from matrix.observability import fleet
from matrix.observability.ingest import refusals_counted
from matrix.observability.queues import queue_depths

log = logging.getLogger(__name__)

# Ingest lag is read off the newest receipts: at most this many, stored
# within this window. An idle system shows an empty histogram, not the lag
# of a result stored an hour ago.
LAG_WINDOW_RESULTS = 1000
LAG_WINDOW_S = 600
LAG_BUCKETS_S = (0.5, 1, 2, 5, 10, 30, 60, 120, 300, 900, 3600)
# Prometheus's own scrape timeout defaults to 10 s.
BROKER_TIMEOUT_S = 2.0


def _age_s(now, then) -> float:
    return max((now - then).total_seconds(), 0.0)


class ApplicationCollector:
    """Yields every ``tilematrix_`` figure; see docs/deploy.md#metrics."""

    def collect(self):
        now = timezone.now()
        parts = {}
        job_queues: set[str] = set()
        for part, compute in (
            ("results", self.results),
            ("ingest_lag", self.ingest_lag),
            ("jobs", lambda now: self.jobs(now, job_queues)),
            ("runners", self.runners),
            ("manifests", self.manifests),
            ("notifications", self.notifications),
            ("reads", self.reads),
        ):
            try:
                families = list(compute(now))
            except Exception as exc:
                # One line, not a traceback a part every scrape while the
                # database is down.
                log.warning("metrics: the %s figures were not read: %r", part, exc)
                parts[part] = False
                continue
            parts[part] = True
            yield from families
        # The broker's queues include the runners', read from the database.
        queues = self._broker_queues(job_queues) if parts["runners"] else None
        yield from self.broker(queues or [fleet.CONTROL_QUEUE])
        ok = GaugeMetricFamily(
            "tilematrix_scrape_part_ok",
            "1 where this part of the figures was read on this scrape, 0 where "
            "it failed (the database down, a query error: see the log)",
            labels=["part"],
        )
        for part, read in parts.items():
            ok.add_metric([part], 1 if read else 0)
        yield ok

    def results(self, now):
        newest = Result.objects.aggregate(newest=Max("pk"))["newest"] or 0
        yield CounterMetricFamily(
            "tilematrix_results_stored",
            "Results stored, by every path (ingest, the reaper's infra_error "
            "results): the newest result's id, which grows by one a result "
            "(on PostgreSQL it runs ahead by the ids of rolled-back inserts)",
            value=newest,
        )
        refused = CounterMetricFamily(
            "tilematrix_results_refused",
            "Results ingest refused, by reason, since the counting began",
            labels=["reason"],
        )
        for reason, count in refusals_counted().items():
            refused.add_metric([reason], count)
        yield refused

    def reads(self, now):
        """Whole answers (pages, API answers) by how they were served,
        counted in the cache every web process shares: the cache's hit rate
        is (hit + earlier) / all."""
        answers = CounterMetricFamily(
            "tilematrix_read_answers",
            "Whole answers of the cached reads, by how they were served: hit "
            "(kept for their data version), earlier (the version before, "
            "while another reader computed this one), computed",
            labels=["outcome"],
        )
        for outcome, count in answers_counted().items():
            answers.add_metric([outcome], count)
        yield answers

    def ingest_lag(self, now):
        since = now - timedelta(seconds=LAG_WINDOW_S)
        lags = []
        for stored_at, issued_at, queue in fleet.receipts_newest(LAG_WINDOW_RESULTS):
            # A bundle's or an evidence file's results come home days after
            # they were signed: a lab's turnaround, not ingest's lag.
            if stored_at < since or (queue or "").startswith(fleet.BUNDLE_PREFIX):
                continue
            try:
                signed_at = datetime.fromisoformat(issued_at)
            except ValueError:
                continue
            lags.append(_age_s(stored_at, signed_at))
        buckets = [
            (floatToGoString(bound), sum(1 for lag in lags if lag <= bound))
            for bound in LAG_BUCKETS_S
        ]
        buckets.append(("+Inf", len(lags)))
        yield GaugeHistogramMetricFamily(
            "tilematrix_ingest_lag_seconds",
            f"From a runner signing a result to its storage, over the results "
            f"stored in the last {LAG_WINDOW_S} s (the newest "
            f"{LAG_WINDOW_RESULTS} at most; offline bundles left out): a "
            "distribution of now, so read it without rate()",
            buckets=buckets,
            gsum_value=sum(lags),
        )

    def jobs(self, now, job_queues: set):
        in_flight = GaugeMetricFamily(
            "tilematrix_jobs_in_flight",
            "Jobs queued or running, by stage",
            labels=["state", "stage"],
        )
        queued = GaugeMetricFamily(
            "tilematrix_queue_jobs",
            "Jobs queued (not yet claimed) per queue, as the database has them",
            labels=["queue"],
        )
        waiting = GaugeMetricFamily(
            "tilematrix_queue_oldest_job_age_seconds",
            "Age of the oldest job queued on each queue, from its planning",
            labels=["queue"],
        )
        states = defaultdict(int)
        by_queue = defaultdict(lambda: [0, now])
        sweeps = set()
        rows = (
            ValidationJob.objects.open()
            .values_list("state", "stage", "queue", "sweep_id")
            .annotate(n=Count("id"), oldest=Min("created_at"))
            .order_by()
        )
        for state, stage, queue, sweep_id, n, oldest in rows:
            states[state, stage] += n
            if sweep_id is not None:
                sweeps.add(sweep_id)
            if state == JobState.QUEUED:
                by_queue[queue][0] += n
                by_queue[queue][1] = min(by_queue[queue][1], oldest)
        for state in (JobState.QUEUED, JobState.RUNNING):
            for stage in ValidationJob.Stage.values:
                in_flight.add_metric([state, stage], states[state, stage])
        for queue, (n, oldest) in sorted(by_queue.items()):
            queued.add_metric([queue], n)
            waiting.add_metric([queue], _age_s(now, oldest))
        job_queues.update(by_queue)
        yield from (in_flight, queued, waiting)
        yield from self.sweeps(sweeps)

    def sweeps(self, open_ids: set):
        """Progress of the sweeps with a job queued or running: a finished
        sweep's series end with it."""
        jobs = GaugeMetricFamily(
            "tilematrix_sweep_jobs",
            "Jobs of each unfinished sweep, by state",
            labels=["sweep", "state"],
        )
        progress = GaugeMetricFamily(
            "tilematrix_sweep_progress_ratio",
            "Share of each unfinished sweep's jobs finished (done, failed or lost)",
            labels=["sweep"],
        )
        counts = defaultdict(dict)
        if open_ids:
            for sweep_id, state, n in (
                ValidationJob.objects.filter(sweep_id__in=open_ids)
                .values_list("sweep_id", "state")
                .annotate(n=Count("id"))
                .order_by()
            ):
                counts[sweep_id][state] = n
        totals = dict(Sweep.objects.filter(pk__in=open_ids).values_list("pk", "total"))
        for sweep_id in sorted(counts):
            by_state = counts[sweep_id]
            for state in JobState.values:
                jobs.add_metric([str(sweep_id), state], by_state.get(state, 0))
            total = totals.get(sweep_id) or sum(by_state.values())
            open_jobs = by_state.get(JobState.QUEUED, 0) + by_state.get(
                JobState.RUNNING, 0
            )
            finished = sum(by_state.values()) - open_jobs
            progress.add_metric([str(sweep_id)], finished / total if total else 1.0)
        yield from (jobs, progress)

    def runners(self, now):
        interval = settings.TILEMATRIX_HEARTBEAT_S
        yield GaugeMetricFamily(
            "tilematrix_runner_offline_after_seconds",
            "A runner silent this long is marked offline by the reaper "
            f"({fleet.MISSED_HEARTBEATS} heartbeat intervals)",
            value=fleet.MISSED_HEARTBEATS * interval,
        )
        age = GaugeMetricFamily(
            "tilematrix_runner_heartbeat_age_seconds",
            "Time since each approved, unrevoked runner's last heartbeat "
            "(+Inf: never heard from)",
            labels=["runner", "health"],
        )
        states = GaugeMetricFamily(
            "tilematrix_runners",
            "Approved, unrevoked runners by state and health",
            labels=["state", "health"],
        )
        tally = defaultdict(int)
        for name, last, state, health in fleet.runners_watched().values_list(
            "name", "last_heartbeat", "state", "health"
        ):
            age.add_metric([name, health], _age_s(now, last) if last else math.inf)
            tally[state, health] += 1
        for (state, health), n in sorted(tally.items()):
            states.add_metric([state, health], n)
        yield from (age, states)

    def notifications(self, now):
        """Delivery attempts by channel and outcome, read off their log (the
        control worker sends; a scrape reaches a web process). An indexed
        count over a table that grows by one row per message per channel."""
        sent = CounterMetricFamily(
            "tilematrix_notifications_sent",
            "Notification delivery attempts that the channel took, by channel",
            labels=["channel"],
        )
        failed = CounterMetricFamily(
            "tilematrix_notifications_failed",
            "Notification delivery attempts that failed (each retry counts), "
            "by channel",
            labels=["channel"],
        )
        counts = {
            (channel, ok): n
            for channel, ok, n in DeliveryAttempt.objects.values_list("channel", "ok")
            .annotate(n=Count("pk"))
            .order_by()
        }
        for channel in Channel.values:
            sent.add_metric([channel], counts.get((channel, True), 0))
            failed.add_metric([channel], counts.get((channel, False), 0))
        yield sent
        yield failed

    def manifests(self, now):
        ages = GaugeMetricFamily(
            "tilematrix_manifest_age_seconds",
            "Time since the newest approved manifest covering each device type "
            "was approved",
            labels=["device_type"],
        )
        fields = ("vendor", "model", "arch", "backend")
        rows = (
            UpgradeProposal.objects.filter(
                state__in=[ProposalState.APPROVED, ProposalState.ROLLED_OUT],
                approved_at__isnull=False,
            )
            .values_list(*(f"device_types__{f}" for f in fields))
            .annotate(newest=Max("approved_at"))
            .order_by()
        )
        for *device, newest in rows:
            if device[0] is not None:
                name = str(DeviceType(**dict(zip(fields, device, strict=True))))
                ages.add_metric([name], _age_s(now, newest))
        yield ages

    def _broker_queues(self, job_queues: set) -> list[str] | None:
        try:
            return fleet.broker_queues(job_queues)
        except Exception as exc:
            log.warning("metrics: the runners' queues were not read: %r", exc)
            return None

    def broker(self, queues: list[str]):
        depths, status = queue_depths(queues, timeout_s=BROKER_TIMEOUT_S)
        yield GaugeMetricFamily(
            "tilematrix_broker_up",
            f"1 where the broker answered this scrape within {BROKER_TIMEOUT_S:g} s",
            value=1 if depths is not None else 0,
        )
        if depths is None:
            log.warning("metrics: queue depths left out: broker %s", status)
            return
        messages = GaugeMetricFamily(
            "tilematrix_queue_messages",
            "Messages waiting on each broker queue (a job message carries "
            "5 to 25 jobs; a result message up to 50 results)",
            labels=["queue"],
        )
        for queue, depth in sorted(depths.items()):
            messages.add_metric([queue], depth)
        yield messages


registry = CollectorRegistry()
registry.register(ApplicationCollector())


def metrics_response(request) -> HttpResponse:
    """The figures, for a caller holding ``TILEMATRIX_METRICS_TOKEN`` as a
    bearer token. Without a token set they are served only with DEBUG on
    (the embedded default on a laptop): runner names, queues and device
    types describe the fleet, and a deployment says who may read them."""
    if request.method not in ("GET", "HEAD"):
        return HttpResponse(status=405, headers={"Allow": "GET, HEAD"})
    token = settings.TILEMATRIX_METRICS_TOKEN
    if token:
        given = request.headers.get("Authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            return HttpResponse(
                "a bearer token (TILEMATRIX_METRICS_TOKEN) is required\n",
                status=401,
                content_type="text/plain",
                headers={"WWW-Authenticate": 'Bearer realm="metrics"'},
            )
    elif not settings.DEBUG:
        return HttpResponse(
            "metrics are off: set TILEMATRIX_METRICS_TOKEN and scrape with it "
            "as a bearer token\n",
            status=403,
            content_type="text/plain",
        )
    # OpenMetrics where the scraper asks for it (Prometheus does), which
    # names the ingest lag a gauge histogram; the classic text otherwise.
    encode, content_type = choose_encoder(request.headers.get("Accept"))
    return HttpResponse(encode(registry), content_type=content_type)
