"""Runner workflows on the server side: registration, heartbeats, planning
sweeps, claiming jobs, ingesting signed results and reaping lost runners.

Each is keyword-only and atomic. Bad input raises ``ValidationError`` (400),
an identity or permission problem ``PermissionDenied`` (403) and a conflict
with what is stored ``Conflict`` (409); nothing is half-written.

Callers use this package's names (``services.results_ingest``); the
modules behind them are an arrangement, not an interface.
"""

from __future__ import annotations

from matrix.fleet.services.errors import Conflict
from matrix.fleet.services.ingest import result_ingest, results_ingest
from matrix.fleet.services.liveness import (
    bundle_abandon,
    heartbeat_interval_s,
    job_claim,
    jobs_requeue,
    queued_republish,
    runner_health_set,
    runner_heartbeat,
    runner_reap,
    runner_recover,
    silent_cutoff,
)
from matrix.fleet.services.planning import (
    Capabilities,
    bundle_plan,
    capabilities_online,
    cells_select,
    job_chunks,
    job_payload,
    jobs_envelope,
    jobs_publish,
    sweep_plan,
)
from matrix.fleet.services.registration import (
    broker_users_prune,
    hosted_toolchains,
    runner_approve,
    runner_evidence_adopt,
    runner_refuse,
    runner_register,
    runner_revoke,
    token_create,
    token_create_unless_just_made,
)
from matrix.fleet.services.requests import (
    jobs_claim,
    outbox_pending,
    runner_queues,
    runner_reconnect,
)

__all__ = [
    "Capabilities",
    "Conflict",
    "broker_users_prune",
    "bundle_abandon",
    "bundle_plan",
    "heartbeat_interval_s",
    "capabilities_online",
    "cells_select",
    "job_chunks",
    "job_claim",
    "job_payload",
    "jobs_claim",
    "jobs_envelope",
    "jobs_publish",
    "jobs_requeue",
    "outbox_pending",
    "queued_republish",
    "result_ingest",
    "results_ingest",
    "hosted_toolchains",
    "runner_approve",
    "runner_evidence_adopt",
    "runner_health_set",
    "runner_heartbeat",
    "runner_queues",
    "runner_reap",
    "runner_reconnect",
    "runner_refuse",
    "runner_recover",
    "runner_register",
    "runner_revoke",
    "silent_cutoff",
    "sweep_plan",
    "token_create",
    "token_create_unless_just_made",
]
