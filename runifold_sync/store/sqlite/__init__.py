"""The embedded SQLite store."""
