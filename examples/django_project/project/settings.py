"""Minimal settings: Django's own tables in SQLite, workflows in a runifold store."""

import os
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent

SECRET_KEY = "example-only-not-a-secret"
DEBUG = True
ALLOWED_HOSTS = ["localhost", "127.0.0.1", "testserver"]
INSTALLED_APPS = ["runifold_sync.contrib.django", "shop"]
MIDDLEWARE: list[str] = []
ROOT_URLCONF = "project.urls"
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": BASE_DIR / "db.sqlite3"}}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True

RUNIFOLD_DATABASE_URL = os.environ.get("RUNIFOLD_DATABASE_URL", f"sqlite:///{BASE_DIR / 'workflows.db'}")
RUNIFOLD_APP = "shop.workflows:registry"
RUNIFOLD_CONCURRENCY = 2
