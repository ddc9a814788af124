"""The PostgreSQL store (psycopg 3 and psycopg-pool)."""
