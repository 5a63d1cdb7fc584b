from __future__ import annotations

import contextlib
import os
import queue as queue_module
import stat
import subprocess
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from matrix import config
from tests import forkserver

ROOT = Path(__file__).resolve().parents[2]
STRONG_SECRET = "k3y-" + "x7Qa9#Lm2!pZ" * 5


def manage(*args, env_extra: dict, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DJANGO_", "DATABASE_URL", "CELERY_"))
    }
    env.update({"TILEMATRIX_VAR_DIR": str(tmp_path / "var")}, **env_extra)
    return forkserver.run(["manage.py", *args], cwd=ROOT, env=env, timeout=120)


def test_unset_database_url_means_the_embedded_sqlite_file(tmp_path):
    db = config.parse_database(None, tmp_path / "db.sqlite3")
    assert db["ENGINE"] == "django.db.backends.sqlite3"
    assert db["NAME"] == str(tmp_path / "db.sqlite3")


def test_postgres_url_gives_postgresql_with_health_checks(tmp_path):
    db = config.parse_database("postgres://tm:pw@db.internal:5433/tilematrix", tmp_path)
    assert db["ENGINE"] == "django.db.backends.postgresql"
    assert (db["HOST"], db["PORT"], db["NAME"]) == ("db.internal", 5433, "tilematrix")
    assert db["CONN_HEALTH_CHECKS"] is True
    assert db["OPTIONS"] == {"server_side_binding": True, "prepare_threshold": 5}


@pytest.mark.parametrize(
    "raw",
    ["mysql://u@h/db", "not a url", "postgres:/missing-slashes", "postgres://h:5432/"],
)
def test_a_malformed_database_url_names_the_variable(raw, tmp_path):
    with pytest.raises(ImproperlyConfigured, match="^DATABASE_URL: "):
        config.parse_database(raw, tmp_path)


def test_unset_broker_means_the_filesystem_broker_under_var(tmp_path):
    url, options = config.parse_broker(None, tmp_path / "broker")
    assert url == "filesystem://localhost/"
    assert Path(options["data_folder_in"]).is_dir()


def test_the_embedded_broker_connects_without_kombu_warning(tmp_path, caplog):
    """A URL without a host had kombu log "No hostname was supplied" on every
    connection: a stray line in the output of `manage.py sweep`."""
    from kombu import Connection

    url, _ = config.parse_broker(None, tmp_path / "broker")
    with caplog.at_level("WARNING", logger="kombu"):
        Connection(url).as_uri()
    assert caplog.records == []


def test_the_embedded_broker_is_served_by_the_transport_safe_for_several_processes():
    assert (
        config.broker_transport("filesystem://localhost/") == "runners.broker:Transport"
    )
    assert config.broker_transport("redis://127.0.0.1:6379/3") is None


@pytest.mark.parametrize(
    "raw", ["redis://127.0.0.1:6379/3", "amqp://guest:guest@127.0.0.1:5672//"]
)
def test_redis_and_rabbitmq_brokers_are_taken_by_url(raw, tmp_path):
    assert config.parse_broker(raw, tmp_path)[0] == raw


def test_per_runner_broker_users_are_off_unless_the_admin_url_is_set():
    assert config.parse_broker_admin(None, "redis://127.0.0.1:6379/0") == ""
    assert config.parse_broker_admin("", "amqp://127.0.0.1//") == ""
    url = "http://admin:secret@rabbit:15672/"
    assert config.parse_broker_admin(url, "amqp://tm:pw@rabbit:5672//") == url


@pytest.mark.parametrize(
    ("raw", "broker", "says"),
    [
        ("rabbit:15672", "amqp://rabbit//", "expected http://USER:PASSWORD@HOST"),
        ("http://rabbit:15672/", "amqp://rabbit//", "the management user's name"),
        ("http://a:b@rabbit:15672/", "redis://r:6379/0", "need RabbitMQ"),
        ("http://a:b@rabbit:15672/", "filesystem://localhost/", "need RabbitMQ"),
    ],
)
def test_a_broker_admin_url_that_cannot_work_stops_the_server(raw, broker, says):
    with pytest.raises(ImproperlyConfigured, match="TILEMATRIX_BROKER_ADMIN_URL") as e:
        config.parse_broker_admin(raw, broker)
    assert says in str(e.value)


def test_deployments_sharing_a_redis_keep_to_their_own_keys(tmp_path):
    """Queues of two deployments on one Redis (or two test clusters) would
    cross without a key prefix; a message sent with one prefix is seen only
    by a connection with the same prefix."""
    from kombu import Connection

    raw = "redis://127.0.0.1:6379/13"
    _, ours = config.parse_broker(raw, tmp_path, keyprefix="ours:")
    _, theirs = config.parse_broker(raw, tmp_path, keyprefix="theirs:")
    assert ours["visibility_timeout"] == 900
    try:
        with Connection(raw, transport_options=ours) as connection:
            connection.SimpleQueue("runner.shared").put("for us")
        with Connection(raw, transport_options=theirs) as connection:
            with pytest.raises(queue_module.Empty):
                connection.SimpleQueue("runner.shared").get(block=False)
        with Connection(raw, transport_options=ours) as connection:
            message = connection.SimpleQueue("runner.shared").get(timeout=5)
            assert message.payload == "for us"
    except OSError:
        pytest.skip("no Redis at 127.0.0.1:6379")
    finally:
        import redis

        with contextlib.suppress(OSError):
            redis.Redis.from_url(raw).flushdb()


def test_the_celery_app_takes_the_broker_options_of_the_settings():
    """Celery reads CELERY_BROKER_TRANSPORT_OPTIONS over a later change to
    app.conf: options set after configuration (the embedded broker's
    polling interval, a key prefix) were silently dropped."""
    from django.conf import settings

    from matrix.celery import app

    options = app.conf.broker_transport_options
    assert options == settings.CELERY_BROKER_TRANSPORT_OPTIONS
    if settings.CELERY_BROKER_URL.startswith("filesystem"):
        assert options["polling_interval"] == 0.1
        assert Path(options["control_folder"]).is_dir()


@pytest.mark.parametrize("raw", ["kafka://x", "127.0.0.1:6379"])
def test_a_malformed_broker_url_names_the_variable(raw, tmp_path):
    with pytest.raises(ImproperlyConfigured, match="^CELERY_BROKER_URL: "):
        config.parse_broker(raw, tmp_path)


def test_without_a_session_cache_sessions_stay_in_the_database():
    caches = config.parse_cache(None)
    assert list(caches) == ["default"]


def test_a_redis_session_cache_is_shared_by_every_web_process():
    caches = config.parse_cache("redis://cache.internal:6379/3")
    assert caches["sessions"]["BACKEND"].endswith("RedisCache")
    assert caches["sessions"]["LOCATION"] == "redis://cache.internal:6379/3"
    assert caches["default"]["BACKEND"].endswith("LocMemCache")


def test_a_shared_cache_keeps_computed_reads_for_every_web_process():
    caches = config.parse_cache(None, "redis://cache.internal:6379/2")
    assert caches["default"]["BACKEND"] == "matrix.cache.TolerantRedisCache"
    assert caches["default"]["LOCATION"] == "redis://cache.internal:6379/2"
    assert "sessions" not in caches


@pytest.mark.parametrize("raw", ["memcached://x:11211", "cache.internal:6379"])
def test_a_malformed_shared_cache_url_names_the_variable(raw):
    with pytest.raises(ImproperlyConfigured, match="^TILEMATRIX_CACHE_URL: "):
        config.parse_cache(None, raw)


def test_with_a_session_cache_sessions_are_read_from_it(tmp_path):
    proc = manage(
        "diffsettings",
        env_extra={"TILEMATRIX_SESSION_CACHE_URL": "redis://127.0.0.1:6379/3"},
        tmp_path=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert "SESSION_ENGINE = 'matrix.sessions'" in proc.stdout
    assert "SESSION_CACHE_ALIAS = 'sessions'" in proc.stdout


@pytest.mark.parametrize("raw", ["memcached://x:11211", "cache.internal:6379"])
def test_a_malformed_session_cache_url_names_the_variable(raw):
    with pytest.raises(ImproperlyConfigured, match="TILEMATRIX_SESSION_CACHE_URL"):
        config.parse_cache(raw)


@pytest.mark.parametrize("raw", ["maybe", "2", "enabled"])
def test_an_unclear_debug_flag_is_refused_not_guessed(raw):
    with pytest.raises(ImproperlyConfigured, match="^DJANGO_DEBUG: "):
        config.parse_bool("DJANGO_DEBUG", raw, True)


def test_the_heartbeat_interval_comes_from_the_environment_on_both_sides(tmp_path):
    # The server's reaper and the runner agent's heartbeat timer read it alike.
    proc = manage(
        "shell",
        "-c",
        "from matrix.fleet import services; from runners import config; "
        "print(services.heartbeat_interval_s(), config.heartbeat_interval_s())",
        env_extra={"TILEMATRIX_HEARTBEAT_S": "2.5"},
        tmp_path=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "2.5 2.5"
    assert config.parse_seconds("TILEMATRIX_HEARTBEAT_S", None, 30.0) == 30.0


@pytest.mark.parametrize("raw", ["0", "-5", "thirty", "inf", "nan"])
def test_a_bad_number_of_seconds_names_the_variable(raw):
    with pytest.raises(ImproperlyConfigured, match="^TILEMATRIX_REAP_S: "):
        config.parse_seconds("TILEMATRIX_REAP_S", raw, 30.0)


@pytest.mark.parametrize("raw", ["0", "-1", "two", "1.5", "65"])
def test_a_bad_number_of_ingest_queues_names_the_variable(raw):
    with pytest.raises(ImproperlyConfigured, match="^TILEMATRIX_INGEST_QUEUES: "):
        config.parse_count("TILEMATRIX_INGEST_QUEUES", raw, 1, most=64)
    assert config.parse_count("TILEMATRIX_INGEST_QUEUES", " ", 1, most=64) == 1
    assert config.parse_count("TILEMATRIX_INGEST_QUEUES", "4", 1, most=64) == 4


def test_production_refuses_a_weak_or_missing_secret(tmp_path):
    with pytest.raises(ImproperlyConfigured, match="^DJANGO_SECRET_KEY: "):
        config.parse_secret("short", debug=False, embedded_file=tmp_path / "k")
    with pytest.raises(ImproperlyConfigured, match="^DJANGO_SECRET_KEY: "):
        config.parse_secret(None, debug=False, embedded_file=tmp_path / "k")


def test_the_embedded_secret_is_generated_once_and_kept(tmp_path):
    first = config.parse_secret(None, debug=True, embedded_file=tmp_path / "k")
    assert len(first) >= 50
    assert config.parse_secret(None, debug=True, embedded_file=tmp_path / "k") == first


def test_production_needs_allowed_hosts():
    with pytest.raises(ImproperlyConfigured, match="^DJANGO_ALLOWED_HOSTS: "):
        config.parse_hosts(None, debug=False)
    assert config.parse_hosts("a.example, b.example", debug=False) == [
        "a.example",
        "b.example",
    ]


def test_start_fails_with_a_message_naming_the_bad_variable(tmp_path):
    proc = manage("check", env_extra={"DATABASE_URL": "mysql://x/y"}, tmp_path=tmp_path)
    assert proc.returncode != 0
    assert "DATABASE_URL: expected postgres://" in proc.stderr


def test_deploy_check_passes_with_production_settings(tmp_path):
    proc = manage(
        "check",
        "--deploy",
        "--fail-level",
        "WARNING",
        env_extra={
            "DJANGO_DEBUG": "0",
            "DJANGO_SECRET_KEY": STRONG_SECRET,
            "DJANGO_ALLOWED_HOSTS": "tilematrix.example",
        },
        tmp_path=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_var_keeps_the_database_and_the_secret_key_for_its_owner_only(tmp_path):
    # An older checkout left them readable by every user of the host.
    var = tmp_path / "var"
    var.mkdir(mode=0o755)
    (var / "db.sqlite3").write_bytes(b"")
    (var / "db.sqlite3").chmod(0o644)
    done = manage("check", env_extra={}, tmp_path=tmp_path)
    assert done.returncode == 0, done.stderr
    assert stat.S_IMODE(var.stat().st_mode) == 0o700
    assert stat.S_IMODE((var / "db.sqlite3").stat().st_mode) == 0o600
    assert stat.S_IMODE((var / "secret_key").stat().st_mode) == 0o600


def test_a_new_embedded_database_is_never_readable_by_others(tmp_path):
    database = config.parse_database(None, tmp_path / "db.sqlite3")
    config.private_sqlite(database)
    assert stat.S_IMODE((tmp_path / "db.sqlite3").stat().st_mode) == 0o600
    config.private_sqlite(config.parse_database("sqlite://:memory:", tmp_path))
    assert not Path(":memory:").exists()
