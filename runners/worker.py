"""What makes a Celery worker a runner host: a consumer step that, each
time the worker connects to the broker, recovers lost work and then sends
signed heartbeats on the worker's own timer, so heartbeats stop exactly when
the worker does."""

from __future__ import annotations

import logging
import os
import time

from celery import bootsteps

from runners import host, services

log = logging.getLogger(__name__)


class RunnerHost(bootsteps.StartStopStep):
    requires = {"celery.worker.consumer.tasks:Tasks"}

    def __init__(self, parent, **kwargs):
        self.enabled = bool(os.environ.get(host.RUNNER_DIR_ENV))
        self.connected_before = False
        self.timer_ref = None
        super().__init__(parent, **kwargs)

    def start(self, parent):
        from runners.models import Runner

        config = host.HostConfig.load(host.runner_dir())
        runner = Runner.objects.get(name=config.name)
        if not self.connected_before:
            counts = services.runner_recover(runner=runner)
        else:
            # Running jobs survive a broker reconnect; only messages may be gone.
            counts = {
                "republished": services.queued_republish(runner=runner),
                "results resent": host.outbox_flush(config=config),
            }
        self.connected_before = True
        log.info("runner %s connected: %s", config.name, counts)
        self.beat(config)
        self.timer_ref = parent.timer.call_repeatedly(
            services.heartbeat_interval_s(), self.beat, (config,), priority=10
        )

    def stop(self, parent):
        if self.timer_ref is not None:
            self.timer_ref.cancel()
            self.timer_ref = None

    def beat(self, config: host.HostConfig) -> None:
        from runners.tasks import heartbeat

        envelope = services.heartbeat_envelope(
            runner_name=config.name,
            # Wall-clock microseconds: they keep growing across restarts
            # without the runner storing a counter.
            sequence=time.time_ns() // 1000,
            state="online",
            key=config.key,
        )
        try:
            heartbeat.apply_async(args=[envelope], queue="control", retry=False)
        except Exception as exc:  # the broker is away: the next beat tries again
            log.warning("heartbeat not sent: %s", exc)
