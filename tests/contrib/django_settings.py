"""The example project's settings with Django's own database moved to a test file.

Used only in the subprocess that ``test_django.py`` starts (``DJANGO_SETTINGS_MODULE``),
with ``examples/django_project`` on ``PYTHONPATH``. The store URL comes from
``RUNIFOLD_DATABASE_URL`` as in the example; each case overrides it with its own file.
"""

import os

from project.settings import *  # noqa: F403

DATABASES = {
    "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": os.environ["RUNIFOLD_TEST_DJANGO_DB"]}
}
