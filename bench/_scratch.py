"""A scratch deployment for benchmarks: a fresh database (PostgreSQL when
DATABASE_URL names one, else a SQLite file) and broker (the Redis database
index CELERY_BROKER_URL names, emptied before and after, or else a
filesystem folder), migrated and seeded, removed afterwards. Call
``scratch_setup()`` before importing anything from Django."""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

REPO = Path(__file__).resolve().parent.parent


def scratch_setup() -> dict:
    sys.path.insert(0, str(REPO))
    root = Path(tempfile.mkdtemp(prefix="tm-bench-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    os.environ["TILEMATRIX_VAR_DIR"] = str(root)
    os.environ["TILEMATRIX_SERVER_KEY_FILE"] = str(root / "server.key")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "matrix.settings")
    info = {"database": "sqlite", "broker": "filesystem"}
    database = os.environ.get("DATABASE_URL", "")
    if database.startswith(("postgres", "pgsql")):
        import psycopg

        admin = urlunsplit(urlsplit(database)._replace(path="/postgres"))
        # Named after the database DATABASE_URL gives, which is left alone.
        base = urlsplit(database).path.strip("/") or "tm_bench"
        name = f"{base}_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')

        def drop():
            from django.db import connections

            connections.close_all()
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

        atexit.register(drop)
        os.environ["DATABASE_URL"] = urlunsplit(
            urlsplit(database)._replace(path=f"/{name}")
        )
        info["database"] = "postgresql"
    broker = os.environ.get("CELERY_BROKER_URL", "")
    if broker.startswith("redis"):
        import redis

        url = broker
        if urlsplit(url).path.strip("/") in ("", "0"):
            raise SystemExit(
                "CELERY_BROKER_URL: name a Redis database index of the bench's "
                "own (redis://HOST:6379/N): it is emptied"
            )
        redis.Redis.from_url(url).flushdb()
        atexit.register(lambda: redis.Redis.from_url(url).flushdb())
        info["broker"] = "redis"

    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
    call_command("seed_demo", stdout=open(os.devnull, "w"))
    return info


def table(rows: list[tuple], headers: tuple) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows, strict=True)]
    line = "  ".join(f"{{:<{w}}}" for w in widths)
    out = [line.format(*headers), line.format(*("-" * w for w in widths))]
    out += [line.format(*map(str, row)) for row in rows]
    return "\n".join(out)
