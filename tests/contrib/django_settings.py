"""The example project's settings with Django's own database moved to a test database.

Used only in the subprocesses that ``test_django.py`` starts (``DJANGO_SETTINGS_MODULE``),
with ``examples/django_project`` on ``PYTHONPATH``: a SQLite file
(``RUNIFOLD_TEST_DJANGO_DB``), or the PostgreSQL database ``RUNIFOLD_TEST_DJANGO_PG_URL``
names. The store URL comes from ``RUNIFOLD_DATABASE_URL`` as in the example; each case
overrides it, or puts the store in Django's database (``RUNIFOLD_DATABASE``).
"""

import os
from urllib.parse import unquote, urlsplit

from project.settings import *  # noqa: F403

_PG = os.environ.get("RUNIFOLD_TEST_DJANGO_PG_URL")
if _PG:
    _url = urlsplit(_PG)
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": _url.path.lstrip("/"),
            "USER": unquote(_url.username or ""),
            "PASSWORD": unquote(_url.password or ""),
            "HOST": _url.hostname,
            "PORT": str(_url.port or 5432),
        }
    }
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": os.environ["RUNIFOLD_TEST_DJANGO_DB"],
            # Django 5.1+: atomic() takes the write lock at BEGIN, as the store's own
            # transactions do, so a read-then-write step never fails on an upgrade.
            "OPTIONS": {"transaction_mode": "IMMEDIATE"},
        }
    }
