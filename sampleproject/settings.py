"""Settings of the sample project.

Side-effect free on purpose: ``tests/settings.py`` imports its MIDDLEWARE and TEMPLATES from here.
Everything a deployment or the demo changes comes from the environment.
"""

import os
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlsplit

import django

BASE_DIR = Path(__file__).resolve().parent.parent


def _env_seconds(name: str, default: timedelta) -> timedelta:
    value = os.environ.get(name)
    return timedelta(seconds=float(value)) if value else default


SECRET_KEY = os.environ.get("SECRET_KEY", "django-insecure-delayjobs-sample-only-for-development")
DEBUG = os.environ.get("DEBUG", "1").lower() in {"1", "true", "yes", "on"}
ALLOWED_HOSTS = ["localhost", "127.0.0.1"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "delayjobs",
    "sampleproject.meetings",
    "sampleproject.orders",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "sampleproject.urls"
WSGI_APPLICATION = "sampleproject.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "sampleproject" / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("DATABASE_PATH", str(BASE_DIR / "db.sqlite3")),
        "OPTIONS": {
            # The consumer writes from several threads while the web process writes too:
            # WAL lets readers go on during a write, IMMEDIATE takes the write lock at BEGIN
            # (no deadlock-prone lock upgrade), and the timeout waits instead of failing.
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL",
            "transaction_mode": "IMMEDIATE",
            "timeout": 20,
        },
    }
}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"

# Reminders are "sent" by email; locmem keeps them in memory so the demo and tests send
# nothing anywhere. The Reminder rows are what shows that a reminder fired.
_EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
if django.VERSION >= (6, 1):  # MAILERS replaces EMAIL_BACKEND from Django 6.1
    MAILERS = {"default": {"BACKEND": _EMAIL_BACKEND}}
else:
    EMAIL_BACKEND = _EMAIL_BACKEND
DEFAULT_FROM_EMAIL = "meetings@localhost"

DELAYJOBS = {
    "REDIS_URL": os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"),
    "KEY_PREFIX": "delayjobs-sample",
    "PRELOAD_INTERVAL": 5,
    "PRELOAD_WINDOW": 60,
}

# Celery (optional): beat runs the pre-loader; `run_delay_consumer --executor celery`
# hands each due job to a Celery worker. The broker is the same Redis, another database.
CELERY_BROKER_URL = os.environ.get(
    "CELERY_BROKER_URL", urlsplit(DELAYJOBS["REDIS_URL"])._replace(path="/1").geturl()
)
CELERY_TASK_IGNORE_RESULT = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BEAT_SCHEDULE = {
    "delayjobs-preload": {"task": "delayjobs.tasks.preload", "schedule": 5.0},
}

# An unpaid order is closed this long after it was placed.
ORDER_PAYMENT_TIMEOUT = _env_seconds("ORDER_PAYMENT_TIMEOUT_SECONDS", timedelta(minutes=30))

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    # Milliseconds, because how late a job ran is what the demo is about.
    "formatters": {
        "timestamped": {
            "format": "%(asctime)s.%(msecs)03d %(levelname)-7s %(name)s: %(message)s",
            "datefmt": "%H:%M:%S",
        },
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "timestamped"}},
    "loggers": {
        name: {"handlers": ["console"], "level": "INFO", "propagate": False}
        for name in ("delayjobs", "sampleproject")
    },
}
