"""Public import path of the embedded SQLite store."""

from .store.sqlite.store import SqliteWorkflowStore

__all__ = ["SqliteWorkflowStore"]
