"""What makes a Celery worker a runner host: a consumer step that, each
time the worker connects to the broker, has the server recover lost work
(over HTTP: a runner worker holds no database credentials) and then sends
signed heartbeats on the worker's own timer, so heartbeats stop exactly when
the worker does, and never wait for its jobs: they say ``busy`` while a job
runs. A runner in maintenance gives its job messages back and stops reading
its runner queues; on each heartbeat the step asks the server whether it is
active again and, once it is, reads them again. On each heartbeat too, the
results the server has not stored within OUTBOX_RESEND_BEATS heartbeats are
sent again: a control worker killed mid-ingest may have lost them. A runner
short of disk pauses the same way as one in maintenance, and reads its queues
again once a heartbeat finds room."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time

from billiard.process import current_process
from celery import bootsteps
from celery.exceptions import WorkerShutdown
from celery.worker import state as worker_state

from runners import client, host, protocol
from runners import config as agent_config

log = logging.getLogger(__name__)

RECOVER_TIMEOUT_S = 120
RECOVER_RETRY_MAX_S = 30
# Asked on the consumer's timer, which it holds up: short.
RESUME_TIMEOUT_S = 10
# A result still awaited this many heartbeats after it was sent is sent again.
OUTBOX_RESEND_BEATS = 2


class RunnerHost(bootsteps.StartStopStep):
    requires = {"celery.worker.consumer.tasks:Tasks"}

    def __init__(self, parent, **kwargs):
        self.enabled = bool(os.environ.get(host.RUNNER_DIR_ENV))
        self.connected_before = False
        self.runner_queues: list[str] = []
        self.timer_ref = None
        self.outbox_thread: threading.Thread | None = None
        super().__init__(parent, **kwargs)

    def start(self, parent):
        config = host.HostConfig.load(host.runner_dir())
        if not self.connected_before:
            # What a maintenance pause may stop reading, and resume reads
            # again; a reconnect keeps the queues as the pause left them.
            self.runner_queues = queues_runner(parent.app)
        # Before the worker takes a message: on a restart the server must give
        # what this runner was running another attempt first, or it would
        # take back jobs the new worker has just claimed.
        try:
            counts = self.recover(config, restarted=not self.connected_before)
        except RunnerRefused as exc:
            log.error(
                "runner %s is refused by %s (%s): it takes no more jobs; a "
                "revoked host registers again under a new name",
                config.name,
                config.server,
                exc,
            )
            raise WorkerShutdown(1) from None
        if counts is None:
            return  # the worker is shutting down
        self.connected_before = True
        log.info("runner %s connected: %s", config.name, counts)
        self.beat(config)
        self.timer_ref = parent.timer.call_repeatedly(
            agent_config.heartbeat_interval_s(),
            self.tick,
            (parent, config),
            priority=10,
        )

    def tick(self, parent, config: host.HostConfig) -> None:
        self.beat(config)
        self.resume(parent, config)
        self.outbox_check(config)

    def outbox_check(self, config: host.HostConfig) -> None:
        """Have a thread of its own (it asks the server over HTTP, and the
        timer must not wait for that) send again the results kept for
        OUTBOX_RESEND_BEATS heartbeats that the server still awaits."""
        if self.outbox_thread is not None and self.outbox_thread.is_alive():
            return
        self.outbox_thread = threading.Thread(
            target=outbox_resend, args=(config,), name="outbox", daemon=True
        )
        self.outbox_thread.start()

    def resume(self, parent, config: host.HostConfig) -> None:
        """Read again the runner queues a maintenance pause stopped reading,
        once the server says the runner is active. Through control messages
        to this very worker, as the pause was: the timer may run in a thread
        of its own, and only the consumer may change what it reads."""
        reading = set(queues_runner(parent.app))
        paused = [q for q in self.runner_queues if q not in reading]
        if not paused:
            return
        # A pause for want of disk ends once there is room again.
        if short := host.disk_check(config):
            log.info("runner %s still waits for room: %s", config.name, short)
            return
        try:
            health = client.signed_request(
                config, "queues", timeout=RESUME_TIMEOUT_S
            ).get("health")
        except client.ServerRefused as exc:
            if exc.status != 403:
                log.warning("runner %s cannot ask for its health: %s", config.name, exc)
                return
            log.error(
                "runner %s is refused (%s): it takes no more jobs", config.name, exc
            )
            self.runner_queues = []  # nothing to read again, ever
            jobs_stop_from_task()
            return
        except client.ServerUnavailable as exc:
            log.warning("runner %s cannot ask for its health: %s", config.name, exc)
            return
        if health != host.ACTIVE:
            return
        log.info(
            "runner %s is active again: reading %s", config.name, ", ".join(paused)
        )
        for queue in paused:
            parent.app.control.add_consumer(queue, destination=[parent.hostname])

    def recover(self, config: host.HostConfig, *, restarted: bool) -> dict | None:
        """Ask the server, over HTTP, to recover what a (re)connect may have
        lost: after a restart nothing this runner was running survives; after
        a broker reconnect running jobs survive, only messages may be gone,
        and results not yet seen stored are sent again. Tried until the
        server answers (a runner that cannot reach it could claim nothing);
        None when the worker is asked to stop meanwhile."""
        delay = 1.0
        while True:
            try:
                counts = client.signed_request(
                    config, "recover", timeout=RECOVER_TIMEOUT_S, restarted=restarted
                )
                if not restarted:
                    counts["results resent"] = host.outbox_flush(config=config)
                return counts
            except (client.ServerUnavailable, client.ServerRefused) as exc:
                if isinstance(exc, client.ServerRefused) and exc.status == 403:
                    # Revoked, or a key the server does not know: asking
                    # again changes nothing.
                    raise RunnerRefused(exc.detail) from None
                log.warning(
                    "runner %s cannot recover through %s (trying again in %.0f s): %s",
                    config.name,
                    config.server,
                    delay,
                    exc,
                )
            deadline = time.monotonic() + delay
            while time.monotonic() < deadline:
                if worker_state.should_stop is not None or (
                    worker_state.should_terminate is not None
                ):
                    return None
                time.sleep(0.2)
            delay = min(delay * 2, RECOVER_RETRY_MAX_S)

    def stop(self, parent):
        if self.timer_ref is not None:
            self.timer_ref.cancel()
            self.timer_ref = None

    def beat(self, config: host.HostConfig) -> None:
        envelope = protocol.heartbeat_envelope(
            runner_name=config.name,
            # Wall-clock microseconds: they keep growing across restarts
            # without the runner storing a counter.
            sequence=time.time_ns() // 1000,
            # Requests the pool has started and not finished: jobs running.
            state="busy" if worker_state.active_requests else "online",
            key=config.key,
        )
        try:
            protocol.control_send(protocol.HEARTBEAT, envelope, retry=False)
        except Exception as exc:  # the broker is away: the next beat tries again
            log.warning("heartbeat not sent: %s", exc)


def outbox_resend(config: host.HostConfig) -> None:
    # Here too, not only before a batch: a worker given no job for a while
    # still keeps its kernel cache within its limit.
    host.kernel_cache_keep(config)
    settled_s = OUTBOX_RESEND_BEATS * agent_config.heartbeat_interval_s()
    try:
        resent = host.outbox_flush(config=config, settled_s=settled_s)
    except (client.ServerUnavailable, client.ServerRefused) as exc:
        log.warning(
            "runner %s cannot learn which of its results are awaited: %s",
            config.name,
            exc,
        )
        return
    if resent:
        log.warning(
            "runner %s sent again %d results not stored %.0f s after they were sent",
            config.name,
            resent,
            settled_s,
        )


class RunnerRefused(Exception):
    """The server refuses this runner (revoked, or a key it does not know)."""


def queues_runner(app) -> list[str]:
    """The runner queues (all but control) this worker reads now."""
    return sorted(set(app.amqp.queues.consume_from or ()) - {protocol.CONTROL})


def jobs_pause(app, *, cancel) -> None:
    """Stop reading the runner queues, through ``cancel(queue)``."""
    for queue in queues_runner(app):
        cancel(queue)


def _cancel_from_task(app, hostname: str):
    """The consumer lives in the worker's main process (the parent of a
    prefork child): a task cancels its queues by a control message."""
    return lambda queue: app.control.cancel_consumer(queue, destination=[hostname])


def jobs_stop_from_task() -> None:
    """Take no more jobs, from where raising ``WorkerShutdown`` cannot stop
    the worker (a task in a prefork child, or the consumer's timer): the same
    warm shutdown is asked of the main process by signal."""
    main = os.getpid() if current_process().name == "MainProcess" else os.getppid()
    os.kill(main, signal.SIGTERM)


def jobs_pause_from_task(app, hostname: str) -> None:
    """``jobs_pause`` from inside a task: the worker reads its runner queues
    again when RunnerHost learns that the runner is active."""
    jobs_pause(app, cancel=_cancel_from_task(app, hostname))
