"""Framework integrations: Flask (``runifold_sync.contrib.flask``) and Django
(``runifold_sync.contrib.django``)."""
