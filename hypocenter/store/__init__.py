"""The server's backbone: ingest, attempts, diagnoses, retention and the export queue (outbox).

open_store(url)   → SQLiteStore | PostgresStore     (store/sqlite.py, store/postgres.py)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hypocenter.store.sqlite import SQLiteStore


def open_store(url: str, *, synchronous: str = "FULL") -> SQLiteStore:
    """`sqlite:///path/file.db`, `sqlite://:memory:`, a plain path, or `postgresql://…` (store/postgres.py).
    `synchronous` is SQLite's (setting store_synchronous); PostgreSQL commits durably whatever it says."""
    from hypocenter.store.sqlite import SQLiteStore

    if url.startswith(("postgres://", "postgresql://")):
        from hypocenter.store.postgres import PostgresStore

        return PostgresStore(url)
    path = url.removeprefix("sqlite:///").removeprefix("sqlite://")
    return SQLiteStore(path, synchronous=synchronous)
