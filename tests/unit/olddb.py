"""A log database as an older router left it: for the tests of migrations."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from router.store import schema


def database_at(path: Path, version: int) -> sqlite3.Connection:
    """A SQLite log migrated up to ``version`` only, as an older router left it (the caller closes it)."""
    conn = sqlite3.connect(path)
    conn.execute(schema.version_table_ddl("sqlite"))
    for v, stmts in schema.migrations("sqlite")[:version]:
        for stmt in stmts:
            conn.execute(stmt)
        conn.execute("INSERT INTO schema_version VALUES (?, 0)", (v,))
    return conn
