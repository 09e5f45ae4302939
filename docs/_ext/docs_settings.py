"""Django settings for building the documentation: enough to import every module of
delayjobs (autodoc) and to build its HTTP API's OpenAPI document. Nothing is started."""

SECRET_KEY = "docs-only"
USE_TZ = True
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "delayjobs",
]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
DELAYJOBS = {"REDIS_URL": "redis://127.0.0.1:6379/0"}
ROOT_URLCONF = "docs_urls"
