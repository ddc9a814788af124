"""Authoring: what user code imports to declare workflows, their steps and effects, and
the ``ctx`` they run with. Imports only :mod:`runifold_sync.model` and errors."""
