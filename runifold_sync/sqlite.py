"""Public import path of the embedded SQLite store."""

from .store.sqlite import SqliteWorkflowStore

__all__ = ["SqliteWorkflowStore"]
