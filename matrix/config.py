"""Settings read from the environment, strictly.

A bad value stops the process at start with a message naming the variable:
a typo in ``DATABASE_URL`` must never fall back silently to the embedded
SQLite file and lose a production run's results.
"""

from __future__ import annotations

import functools
import ipaddress
import os
from pathlib import Path
from urllib.parse import urlsplit

import environ
from django.core.exceptions import ImproperlyConfigured

from runners import config as agent

DATABASE_SCHEMES = {"postgres", "postgresql", "pgsql", "sqlite"}
CACHE_SCHEMES = {"redis", "rediss"}
AMQP_SCHEMES = {"amqp", "amqps", "pyamqp"}
TRUE = {"1", "true", "yes", "on"}
FALSE = {"0", "false", "no", "off", ""}


def bad(variable: str, why: str) -> ImproperlyConfigured:
    return ImproperlyConfigured(f"{variable}: {why}")


# The settings a runner reads too are parsed by the agent's own functions
# (runners/config.py), so both read a variable alike; here a bad one stops
# the server as every other setting does.
def _agent_setting(parse):
    @functools.wraps(parse)
    def parsed(*args, **kwargs):
        try:
            return parse(*args, **kwargs)
        except agent.SettingError as exc:
            raise ImproperlyConfigured(str(exc)) from None

    return parsed


url_scheme = _agent_setting(agent.url_scheme)
parse_broker = _agent_setting(agent.parse_broker)
parse_seconds = _agent_setting(agent.parse_seconds)
broker_transport = agent.broker_transport


def parse_networks(variable: str, raw: str | None) -> tuple:
    """Comma-separated IP addresses or networks (``10.0.0.5``,
    ``10.0.0.0/8``, ``::1``); unset or empty: none."""
    networks = []
    for part in (raw or "").split(","):
        if not part.strip():
            continue
        try:
            networks.append(ipaddress.ip_network(part.strip()))
        except ValueError:
            raise bad(
                variable,
                "expected comma-separated IP addresses or networks "
                f"(10.0.0.5, 10.0.0.0/8), got {part.strip()!r}",
            ) from None
    return tuple(networks)


def parse_bool(variable: str, raw: str | None, default: bool) -> bool:
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in TRUE:
        return True
    if value in FALSE:
        return False
    raise bad(variable, f"expected one of 1/0/true/false/yes/no, got {raw!r}")


def parse_count(variable: str, raw: str | None, default: int, *, most: int) -> int:
    """A whole number from 1 to ``most``; unset or empty: ``default``."""
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        value = 0
    if not 1 <= value <= most:
        raise bad(variable, f"expected a whole number from 1 to {most}, got {raw!r}")
    return value


def parse_broker_admin(raw: str | None, broker_url: str) -> str:
    """RabbitMQ's management API (``http://USER:PASS@HOST:15672/``), through
    which each approved runner gets a broker user of its own
    (``matrix/fleet/broker_access.py``); unset or empty: every runner keeps
    the broker URL it was configured with. Only RabbitMQ has users."""
    variable = "TILEMATRIX_BROKER_ADMIN_URL"
    if raw is None or raw.strip() == "":
        return ""
    url_scheme(variable, raw, {"http", "https"}, "http://USER:PASSWORD@HOST:15672/")
    parts = urlsplit(raw)
    if not parts.hostname or not parts.username:
        raise bad(variable, "needs a host and the management user's name")
    if urlsplit(broker_url).scheme not in AMQP_SCHEMES:
        raise bad(
            variable,
            "per-runner broker users need RabbitMQ: CELERY_BROKER_URL must be "
            "amqp://... (Redis and the embedded broker have no users; unset it)",
        )
    return raw


def private_dir(path: Path) -> Path:
    """``path`` as a directory only its owner may enter, made so if it is
    ours: var/ holds the database, the secret key and the signing keys."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    if path.stat().st_uid == os.geteuid():
        path.chmod(0o700)
    return path


def private_file(path: Path) -> None:
    """Create ``path`` empty with mode 0600 (never wider, not for a moment),
    or make an existing one of ours 0600."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        if path.stat().st_uid == os.geteuid():
            path.chmod(0o600)


def private_sqlite(database: dict) -> None:
    """Create an SQLite database's file 0600 before SQLite would create it
    with the umask's mode; its journals take the mode of the file."""
    name = str(database.get("NAME") or "")
    if database["ENGINE"].endswith("sqlite3") and name and name != ":memory:":
        private_file(Path(name))


def parse_database(raw: str | None, embedded_path: Path) -> dict:
    if raw is None or raw == "":
        return {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": str(embedded_path),
            "OPTIONS": {"timeout": 20, "transaction_mode": "IMMEDIATE"},
        }
    url_scheme(
        "DATABASE_URL",
        raw,
        DATABASE_SCHEMES,
        "postgres://USER@HOST:PORT/NAME or sqlite:///PATH",
    )
    try:
        config = environ.Env.db_url_config(raw)
    except Exception as exc:  # environ raises several types for odd URLs
        raise bad(
            "DATABASE_URL", f"cannot be parsed ({exc.__class__.__name__})"
        ) from None
    if config["ENGINE"].endswith("postgresql"):
        if not config.get("NAME"):
            raise bad("DATABASE_URL", "names no database (…/NAME at the end)")
        config.setdefault("CONN_MAX_AGE", 60)
        config.setdefault("CONN_HEALTH_CHECKS", True)
        # Parameters bound by the server, and a statement run five times on
        # a connection prepared there: every page view runs the same few
        # lookups (the user, the data version), whose planning was about
        # half of PostgreSQL's time a view (0.7 -> 0.4 ms on the home page,
        # 2.0 -> 1.0 on the error groups at 1M results).
        options = config.setdefault("OPTIONS", {})
        options.setdefault("server_side_binding", True)
        options.setdefault("prepare_threshold", 5)
    return config


def parse_cache(raw: str | None, shared: str | None = None) -> dict:
    """Return CACHES. ``default`` holds reads computed once per data version
    (rendered pages, API answers, catalogues; keyed by what they depend on):
    with ``shared`` (TILEMATRIX_CACHE_URL) one Redis every web process reads,
    so a read is computed once for all of them; without it a cache inside
    each process. With ``raw`` (TILEMATRIX_SESSION_CACHE_URL) also
    ``sessions``, one cache shared by every web process."""
    caches = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    if shared:
        url_scheme(
            "TILEMATRIX_CACHE_URL", shared, CACHE_SCHEMES, "redis://HOST:PORT/DB"
        )
        caches["default"] = {
            # Computed again, not refused, while Redis is unreachable.
            "BACKEND": "matrix.cache.TolerantRedisCache",
            "LOCATION": shared,
            "KEY_PREFIX": "tilematrix-reads",
            "TIMEOUT": 300,
            "OPTIONS": {"socket_connect_timeout": 0.5, "socket_timeout": 0.5},
        }
    if raw is None or raw == "":
        return caches
    url_scheme(
        "TILEMATRIX_SESSION_CACHE_URL", raw, CACHE_SCHEMES, "redis://HOST:PORT/DB"
    )
    caches["sessions"] = {
        "BACKEND": "matrix.cache.SharedClientRedisCache",
        "LOCATION": raw,
        "KEY_PREFIX": "tilematrix",
        # A Redis that hangs costs a page view half a second, not forever.
        "OPTIONS": {"socket_connect_timeout": 0.5, "socket_timeout": 0.5},
    }
    return caches


def parse_hosts(raw: str | None, debug: bool) -> list[str]:
    if raw is None or raw.strip() == "":
        if debug:
            return ["127.0.0.1", "localhost", "[::1]", "testserver"]
        raise bad("DJANGO_ALLOWED_HOSTS", "must be set when DJANGO_DEBUG is off")
    hosts = [h.strip() for h in raw.split(",") if h.strip()]
    for host in hosts:
        if any(c in host for c in " /:@") and not host.startswith("["):
            raise bad("DJANGO_ALLOWED_HOSTS", f"{host!r} is not a host name")
    return hosts


def parse_secret(raw: str | None, debug: bool, embedded_file: Path) -> str:
    if raw:
        if not debug and (len(raw) < 50 or len(set(raw)) < 5):
            raise bad(
                "DJANGO_SECRET_KEY",
                "must be at least 50 characters with 5 distinct ones in production",
            )
        return raw
    if not debug:
        raise bad("DJANGO_SECRET_KEY", "must be set when DJANGO_DEBUG is off")
    # Embedded default: one random key per checkout, kept under var/ so
    # sessions survive a restart of `make run`.
    if not embedded_file.exists():
        from django.core.management.utils import get_random_secret_key

        embedded_file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            fd = os.open(embedded_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass  # another process made it first; read theirs
        else:
            with os.fdopen(fd, "w") as secret:
                secret.write(get_random_secret_key())
    return embedded_file.read_text().strip()
