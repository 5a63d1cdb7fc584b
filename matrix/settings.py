"""TileMatrix settings: everything that differs between hosts comes from the
environment (see matrix/config.py and the README's configuration table)."""

from __future__ import annotations

import os
from pathlib import Path

from matrix import config
from runners import logs

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = config.private_dir(
    Path(os.environ.get("TILEMATRIX_VAR_DIR", BASE_DIR / "var"))
)

DEBUG = config.parse_bool("DJANGO_DEBUG", os.environ.get("DJANGO_DEBUG"), True)
SECRET_KEY = config.parse_secret(
    os.environ.get("DJANGO_SECRET_KEY"), DEBUG, VAR_DIR / "secret_key"
)
ALLOWED_HOSTS = config.parse_hosts(os.environ.get("DJANGO_ALLOWED_HOSTS"), DEBUG)
DATABASES = {
    "default": config.parse_database(
        os.environ.get("DATABASE_URL"), VAR_DIR / "db.sqlite3"
    )
}
config.private_sqlite(DATABASES["default"])
# Transport options are whole here: Celery reads this setting over any
# change made to app.conf later.
CELERY_BROKER_URL, CELERY_BROKER_TRANSPORT_OPTIONS = config.parse_broker(
    os.environ.get("CELERY_BROKER_URL"),
    VAR_DIR / "broker",
    keyprefix=os.environ.get("TILEMATRIX_BROKER_KEYPREFIX"),
)
CELERY_BROKER_TRANSPORT = config.broker_transport(CELERY_BROKER_URL)
# RabbitMQ's management API: each approved runner gets a broker user of its
# own, limited to its queues (docs/security.md); unset, runners share the
# broker URL they are configured with.
TILEMATRIX_BROKER_ADMIN_URL = config.parse_broker_admin(
    os.environ.get("TILEMATRIX_BROKER_ADMIN_URL"), CELERY_BROKER_URL
)
# Signed results go to this many ingest queues, each runner's always to the
# same one, so as many control workers can store them side by side
# (matrix/fleet/ingest_queues.py); 1 keeps them on the control queue.
TILEMATRIX_INGEST_QUEUES = config.parse_count(
    "TILEMATRIX_INGEST_QUEUES",
    os.environ.get("TILEMATRIX_INGEST_QUEUES"),
    1,
    most=64,
)
# With RabbitMQ's management API: the control and ingest queues each hold at
# most this many MB; past it the oldest message is dropped (a result is
# sent again from its runner's outbox). Set by `control work` at its start.
TILEMATRIX_CONTROL_QUEUE_MAX_MB = config.parse_count(
    "TILEMATRIX_CONTROL_QUEUE_MAX_MB",
    os.environ.get("TILEMATRIX_CONTROL_QUEUE_MAX_MB"),
    2048,
    most=1 << 20,
)
CACHES = config.parse_cache(
    os.environ.get("TILEMATRIX_SESSION_CACHE_URL"),
    os.environ.get("TILEMATRIX_CACHE_URL"),
)
# Every signed-in request reads its session. With a cache shared by all web
# processes it is read from there (written through to the database, and
# read from the database while the cache is down); a cache inside each
# process would keep serving a session that a logout in another process had
# ended.
if "sessions" in CACHES:
    SESSION_ENGINE = "matrix.sessions"
    SESSION_CACHE_ALIAS = "sessions"

INSTALLED_APPS = [
    "matrix.accounts.apps.RoleAdminConfig",  # the admin site, for the admin role only
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_htmx",
    "template_partials",
    "matrix",
    "matrix.fleet",
    "matrix.observability",
    "axes",
]

MIDDLEWARE = [
    # First: the request id covers every line logged below, and the probes
    # and /metrics answer before the host, HTTPS and role checks.
    "matrix.observability.middleware.RequestIdMiddleware",
    "matrix.observability.middleware.OperatorEndpointsMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "matrix.security.SecurityHeadersMiddleware",
    "matrix.api_errors.ApiJsonErrorsMiddleware",
    "matrix.control_chars.ControlCharacterMiddleware",
    # Outside the role and login checks, so their redirects reach it.
    "django_htmx.middleware.HtmxMiddleware",
    "matrix.htmx_login.HtmxLoginRedirectMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "matrix.accounts.roles.RoleMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "axes.middleware.AxesMiddleware",
    # Last, so its process_exception sees a view's refusal first.
    "matrix.refusals.RefusalMiddleware",
]

ROOT_URLCONF = "matrix.urls"
WSGI_APPLICATION = "matrix.wsgi.application"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "matrix.context_processors.roles",
                "matrix.context_processors.filter_choices",
            ],
        },
    },
]

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",  # refuses locked-out logins first
    # ModelBackend, reading the role check with the user (one query).
    "matrix.accounts.auth.RoleModelBackend",
]
# Login throttling: 5 failures for one username from one address lock that
# pair out for 15 minutes, and nobody else (matrix/lockout.py). The address
# is the connection's, or behind the proxies named in
# TILEMATRIX_TRUSTED_PROXIES the one they forwarded.
AXES_FAILURE_LIMIT = 5
AXES_COOLOFF_TIME = 0.25  # hours
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_CLIENT_IP_CALLABLE = "matrix.lockout.client_address"
AXES_LOCKOUT_CALLABLE = "matrix.lockout.lockout_response"
TILEMATRIX_TRUSTED_PROXIES = config.parse_networks(
    "TILEMATRIX_TRUSTED_PROXIES", os.environ.get("TILEMATRIX_TRUSTED_PROXIES")
)
AXES_VERBOSE = False
AXES_SENSITIVE_PARAMETERS = ["password", "token", "registration_token"]
# Anonymous visitors may read pages in the embedded default (DEBUG), so that
# `make run` opens on the matrix; a deployment needs a role for everything.
TILEMATRIX_ANONYMOUS_READ = config.parse_bool(
    "TILEMATRIX_ANONYMOUS_READ", os.environ.get("TILEMATRIX_ANONYMOUS_READ"), DEBUG
)
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "matrix"
LOGOUT_REDIRECT_URL = "matrix"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "staticfiles"

# Production hardening; `check --deploy` passes with DEBUG off.
SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_HTTPONLY = False  # htmx reads the token from the page, not the cookie
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
if not DEBUG:
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_SSL_REDIRECT = config.parse_bool(
        "DJANGO_SECURE_SSL_REDIRECT", os.environ.get("DJANGO_SECURE_SSL_REDIRECT"), True
    )
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_HSTS_SECONDS = 31536000
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = True

# Celery: how messages are delivered and acknowledged is the same on both
# sides of the broker (runners/config.py, CELERY_DELIVERY, applied to the
# server's app in matrix/celery.py and to the runner agent's in runners/app.py).
# Celery closes every database connection before and after each task unless
# this is set: a control worker opened a PostgreSQL connection for each batch
# of results and never kept a statement prepared. Set beyond reach, it leaves
# the connections to matrix/celery.py, which keeps them as between requests.
CELERY_DB_REUSE_MAX = 2**62
# A runner worker signs a heartbeat every TILEMATRIX_HEARTBEAT_S; the reaper
# (run every TILEMATRIX_REAP_S by beat) marks a runner silent for three of
# them offline. Runner hosts and the control host must agree on it.
TILEMATRIX_HEARTBEAT_S = config.parse_seconds(
    "TILEMATRIX_HEARTBEAT_S", os.environ.get("TILEMATRIX_HEARTBEAT_S"), 30.0
)
TILEMATRIX_REAP_S = config.parse_seconds(
    "TILEMATRIX_REAP_S", os.environ.get("TILEMATRIX_REAP_S"), 30.0
)

# /metrics answers a bearer token equal to this; unset, it answers only
# with DEBUG on (docs/deploy.md#metrics).
TILEMATRIX_METRICS_TOKEN = os.environ.get("TILEMATRIX_METRICS_TOKEN", "")
# "json": one JSON object a log line, with the request id (docs/deploy.md).
TILEMATRIX_LOG_FORMAT = logs.log_format(os.environ.get("TILEMATRIX_LOG_FORMAT"))

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"context": {"()": "runners.logs.ContextFilter"}},
    "formatters": {"json": {"()": "runners.logs.JsonFormatter"}},
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "filters": ["context"],
            **({"formatter": "json"} if TILEMATRIX_LOG_FORMAT == "json" else {}),
        }
    },
    "root": {"handlers": ["console"], "level": "INFO"},
    "loggers": {"django": {"level": "INFO"}, "axes": {"level": "WARNING"}},
}

# Notifications (docs/alerts.md). Mail goes through Django's mail framework:
# SMTP where DJANGO_EMAIL_BACKEND says so (EMAIL_HOST and the rest from the
# environment), otherwise each message is a file under var/mail, which the
# demo can show without a mail server.
EMAIL_BACKEND = os.environ.get(
    "DJANGO_EMAIL_BACKEND", "django.core.mail.backends.filebased.EmailBackend"
)
EMAIL_FILE_PATH = VAR_DIR / "mail"
EMAIL_HOST = os.environ.get("EMAIL_HOST", "localhost")
EMAIL_PORT = int(os.environ.get("EMAIL_PORT", "25"))
EMAIL_HOST_USER = os.environ.get("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = os.environ.get("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = config.parse_bool(
    "EMAIL_USE_TLS", os.environ.get("EMAIL_USE_TLS"), False
)
EMAIL_TIMEOUT = 10
DEFAULT_FROM_EMAIL = os.environ.get("DEFAULT_FROM_EMAIL", "tilematrix@localhost")
# Links in messages start with this.
TILEMATRIX_BASE_URL = os.environ.get("TILEMATRIX_BASE_URL", "http://localhost:8000")
TILEMATRIX_NOTIFY_RETRY_BASE_S = config.parse_seconds(
    "TILEMATRIX_NOTIFY_RETRY_BASE_S",
    os.environ.get("TILEMATRIX_NOTIFY_RETRY_BASE_S"),
    30.0,
)
TILEMATRIX_NOTIFY_RUNNER_OFFLINE_S = config.parse_seconds(
    "TILEMATRIX_NOTIFY_RUNNER_OFFLINE_S",
    os.environ.get("TILEMATRIX_NOTIFY_RUNNER_OFFLINE_S"),
    900.0,
)
TILEMATRIX_NOTIFY_RUNNER_PENDING_S = config.parse_seconds(
    "TILEMATRIX_NOTIFY_RUNNER_PENDING_S",
    os.environ.get("TILEMATRIX_NOTIFY_RUNNER_PENDING_S"),
    3600.0,
)
