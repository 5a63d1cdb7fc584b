"""Settings read from the environment, strictly.

A bad value stops the process at start with a message naming the variable:
a typo in ``DATABASE_URL`` must never fall back silently to the embedded
SQLite file and lose a production run's results.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import environ
from django.core.exceptions import ImproperlyConfigured

DATABASE_SCHEMES = {"postgres", "postgresql", "pgsql", "sqlite"}
BROKER_SCHEMES = {"redis", "rediss", "amqp", "amqps", "pyamqp", "filesystem"}
CACHE_SCHEMES = {"redis", "rediss"}
TRUE = {"1", "true", "yes", "on"}
FALSE = {"0", "false", "no", "off", ""}


def bad(variable: str, why: str) -> ImproperlyConfigured:
    return ImproperlyConfigured(f"{variable}: {why}")


def url_scheme(variable: str, raw: str, schemes: set[str], expected: str) -> str:
    """The scheme of a URL setting, or a stop naming the variable and the
    forms it takes."""
    scheme = urlsplit(raw).scheme
    if scheme not in schemes or "://" not in raw:
        raise bad(
            variable,
            f"expected {expected}, got a URL with scheme {scheme or 'none'!r}",
        )
    return scheme


def parse_bool(variable: str, raw: str | None, default: bool) -> bool:
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in TRUE:
        return True
    if value in FALSE:
        return False
    raise bad(variable, f"expected one of 1/0/true/false/yes/no, got {raw!r}")


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
    return config


def parse_broker(raw: str | None, embedded_dir: Path) -> tuple[str, dict]:
    """Return (broker URL, transport options)."""
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
        for sub in ("out", "processed"):
            (embedded_dir / sub).mkdir(parents=True, exist_ok=True)
        folder = str(embedded_dir / "out")
        return raw, {
            "data_folder_in": folder,
            "data_folder_out": folder,
            "processed_folder": str(embedded_dir / "processed"),
            "store_processed": False,
        }
    return raw, {}


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
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
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

        embedded_file.parent.mkdir(parents=True, exist_ok=True)
        embedded_file.write_text(get_random_secret_key())
        embedded_file.chmod(0o600)
    return embedded_file.read_text().strip()
