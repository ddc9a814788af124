"""Public import path of the PostgreSQL store (needs the ``postgres`` extra:
psycopg 3 and psycopg-pool)."""

from .store.postgres.store import PostgresWorkflowStore

__all__ = ["PostgresWorkflowStore"]
