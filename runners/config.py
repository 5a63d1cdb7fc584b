"""The runner agent's settings, read from the environment as the server
reads its own (no Django): the broker, the var directory, the heartbeat
interval and a job's time budget.

The server's settings (``matrix/settings.py``) read the same variables
through these functions, so a runner and the server on one host agree
without a shared settings module. A bad value stops the process at start
with a message naming the variable.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit

PACKAGE_DIR = Path(__file__).resolve().parent
BROKER_SCHEMES = {"redis", "rediss", "amqp", "amqps", "pyamqp", "filesystem"}
# A job's harness budget; its message's soft limit is the sum of its jobs'.
JOB_TIMEOUT_S_DEFAULT = 300.0
HEARTBEAT_S_DEFAULT = 30.0
# The kernel cache's limit, every toolchain's together; and the free space
# under which a runner takes no job (its disk or its temp folder's).
KERNEL_CACHE_MB_DEFAULT = 10240
DISK_FREE_MB_DEFAULT = 1024


# Celery: long GPU jobs are acked late, one at a time, and re-delivered when
# a worker dies; the broker must not re-deliver a job still inside its limit.
# The server's app and the agent's take these alike.
CELERY_DELIVERY = {
    "task_serializer": "json",
    "result_serializer": "json",
    "accept_content": ["json"],
    "task_ignore_result": True,
    "task_acks_late": True,
    "task_reject_on_worker_lost": True,
    "worker_prefetch_multiplier": 1,
    "task_soft_time_limit": 600,
    "task_time_limit": 660,
    "worker_max_tasks_per_child": 200,
    "broker_connection_retry_on_startup": True,
    "task_default_queue": "control",
}


class SettingError(ValueError):
    """A setting the process cannot start with; the message names it."""


def url_scheme(variable: str, raw: str, schemes: set[str], expected: str) -> str:
    """The scheme of a URL setting, or a stop naming the variable and the
    forms it takes."""
    scheme = urlsplit(raw).scheme
    if scheme not in schemes or "://" not in raw:
        raise SettingError(
            f"{variable}: expected {expected}, got a URL with scheme "
            f"{scheme or 'none'!r}"
        )
    return scheme


def parse_seconds(variable: str, raw: str | None, default: float) -> float:
    """A positive, finite number of seconds; unset or empty is the default."""
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SettingError(
            f"{variable}: expected a number of seconds, got {raw!r}"
        ) from None
    if not 0 < value < float("inf"):
        raise SettingError(f"{variable}: expected more than 0 seconds, got {raw!r}")
    return value


def parse_megabytes(variable: str, raw: str | None, default: int) -> int:
    """A whole number of megabytes (0 allowed), in bytes; unset or empty is
    the default."""
    if raw is None or raw.strip() == "":
        return default * 2**20
    try:
        value = int(raw)
    except ValueError:
        raise SettingError(
            f"{variable}: expected a whole number of megabytes, got {raw!r}"
        ) from None
    if value < 0:
        raise SettingError(f"{variable}: expected 0 or more megabytes, got {raw!r}")
    return value * 2**20


def parse_broker(
    raw: str | None, embedded_dir: Path, keyprefix: str | None = None
) -> tuple[str, dict]:
    """Return (broker URL, transport options). A filesystem broker is
    served by ``runners.broker`` (see ``broker_transport``)."""
    if raw is None or raw == "":
        # Named host: without one kombu warns "No hostname was supplied" on
        # every connection. The filesystem transport uses none of it.
        raw = "filesystem://localhost/"
    scheme = url_scheme(
        "CELERY_BROKER_URL",
        raw,
        BROKER_SCHEMES,
        "redis://HOST:PORT/DB, amqp://USER:PASS@HOST:PORT// or filesystem://",
    )
    if scheme == "filesystem":
        for sub in ("out", "processed", "control"):
            (embedded_dir / sub).mkdir(parents=True, exist_ok=True)
        folder = str(embedded_dir / "out")
        return raw, {
            "data_folder_in": folder,
            "data_folder_out": folder,
            "processed_folder": str(embedded_dir / "processed"),
            "store_processed": False,
            # The folder is polled; its 1 s default made each job of a demo
            # sweep wait up to a second for delivery.
            "polling_interval": 0.1,
            # Exchange bindings go under var/, not into the current
            # directory, kombu's default.
            "control_folder": str(embedded_dir / "control"),
        }
    if scheme in ("redis", "rediss"):
        options = {"visibility_timeout": 900}
        if keyprefix:
            # Several deployments (or test runs) sharing one Redis keep to
            # their own keys: the same queue names would otherwise cross.
            options["global_keyprefix"] = keyprefix
        return raw, options
    return raw, {}


def broker_transport(url: str) -> str | None:
    """The kombu transport for a broker URL: this project's filesystem
    transport, safe for several processes, where kombu's own is not; None
    leaves the URL's scheme to choose."""
    if url.startswith("filesystem"):
        return "runners.broker:Transport"
    return None


def var_dir() -> Path:
    """Where the embedded broker, the runner's key directory and its kernel
    cache live: TILEMATRIX_VAR_DIR, else ``var/`` of the checkout the agent
    runs from (the server's own default, so ``make run`` shares one), else
    ``~/.local/state/tilematrix`` for an installed agent."""
    if explicit := os.environ.get("TILEMATRIX_VAR_DIR"):
        return Path(explicit)
    checkout = PACKAGE_DIR.parent
    if (checkout / "manage.py").exists():
        return checkout / "var"
    return Path.home() / ".local" / "state" / "tilematrix"


def heartbeat_interval_s() -> float:
    return parse_seconds(
        "TILEMATRIX_HEARTBEAT_S",
        os.environ.get("TILEMATRIX_HEARTBEAT_S"),
        HEARTBEAT_S_DEFAULT,
    )


def job_budget_s() -> float:
    return parse_seconds(
        "TILEMATRIX_JOB_TIMEOUT_S",
        os.environ.get("TILEMATRIX_JOB_TIMEOUT_S"),
        JOB_TIMEOUT_S_DEFAULT,
    )


def kernel_cache_limit_bytes() -> int:
    return parse_megabytes(
        "TILEMATRIX_RUNNER_KERNEL_CACHE_MB",
        os.environ.get("TILEMATRIX_RUNNER_KERNEL_CACHE_MB"),
        KERNEL_CACHE_MB_DEFAULT,
    )


def disk_free_min_bytes() -> int:
    return parse_megabytes(
        "TILEMATRIX_RUNNER_DISK_FREE_MB",
        os.environ.get("TILEMATRIX_RUNNER_DISK_FREE_MB"),
        DISK_FREE_MB_DEFAULT,
    )
