"""Tables, migrations and records encoded as rows, for SQLite and PostgreSQL alike (rows are read
back into records by ``router.store.rows``).

Both dialects' DDL and SQL come from one column spec, itself derived from the record
dataclasses, so the two databases cannot drift apart. Portable choices: JSON lives in TEXT,
booleans are INTEGER 0/1, upserts use ``ON CONFLICT`` (SQLite >= 3.24, any supported PostgreSQL).
"""

from __future__ import annotations

import json
import operator
import types
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

import orjson

from router.store.records import Estimate, KeyRecord, OutcomeRecord, RequestRecord, StoreDataError, TryRecord

Dialect = Literal["sqlite", "postgres"]
Kind = Literal["text", "int", "float", "bool", "json"]

_TYPES: dict[Dialect, dict[Kind, str]] = {
    "sqlite": {"text": "TEXT", "int": "INTEGER", "float": "REAL", "bool": "INTEGER", "json": "TEXT"},
    "postgres": {
        "text": "TEXT",
        "int": "BIGINT",
        "float": "DOUBLE PRECISION",
        "bool": "INTEGER",
        "json": "TEXT",
    },
}
_INT64 = 2**63


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    kind: Kind
    not_null: bool = False
    since: int = 1  # schema version that added the column


@dataclass(frozen=True, slots=True)
class Table:
    name: str
    columns: tuple[Column, ...]
    primary_key: tuple[str, ...]
    indexes: tuple[tuple[str, tuple[str, ...]], ...] = ()
    since: int = 1  # schema version that created the table
    #: Column names, in order (derived).
    names: tuple[str, ...] = field(init=False)
    #: Column kinds, in order (derived).
    kinds: tuple[Kind, ...] = field(init=False, repr=False, compare=False)
    _getter: operator.attrgetter[Any] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "names", tuple(c.name for c in self.columns))
        object.__setattr__(self, "kinds", tuple(c.kind for c in self.columns))
        # One C call reads a record's values (a request row has ~60 columns): a getattr a column
        # in a comprehension cost several times that, on every request.
        object.__setattr__(self, "_getter", operator.attrgetter(*self.names) if len(self.names) > 1 else None)

    def values_of(self, record: Any) -> tuple[Any, ...]:
        """``record``'s values in column order."""
        if self._getter is None:
            return tuple(getattr(record, n) for n in self.names)
        values: tuple[Any, ...] = self._getter(record)
        return values


def _kind(annotation: Any) -> Kind:
    if get_origin(annotation) in (Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        if len(args) != 1:
            raise TypeError(f"unsupported column type {annotation!r}")
        annotation = args[0]
    base = get_origin(annotation) or annotation
    if base is bool:  # before int: bool is an int subclass
        return "bool"
    if base is int:
        return "int"
    if base is float:
        return "float"
    if base is str:
        return "text"
    if base in (list, dict):
        return "json"
    raise TypeError(f"unsupported column type {annotation!r}")


def columns_of(record_type: type, not_null: Iterable[str] = ()) -> tuple[Column, ...]:
    """The column spec of a record dataclass, in field order."""
    hints = get_type_hints(record_type)
    required = set(not_null)
    return tuple(
        Column(f.name, _kind(hints[f.name]), f.name in required, int(f.metadata.get("since", 1)))
        for f in fields(record_type)
    )


REQUESTS = Table(
    "requests",
    columns_of(RequestRecord, not_null=("request_id", "ts")),
    primary_key=("request_id",),
    indexes=(
        ("requests_task_id_idx", ("task_id",)),
        ("requests_ts_idx", ("ts",)),
    ),
)
# No separate outcomes(task_id) index: the primary key's leading column already serves it.
OUTCOMES = Table(
    "outcomes",
    columns_of(OutcomeRecord, not_null=("task_id", "attempt", "source", "success", "ts", "explicit")),
    primary_key=("task_id", "attempt", "source"),
)
KEYS = Table(
    "keys",
    columns_of(KeyRecord, not_null=("key_id", "key_hash", "prefix", "name", "created_at")),
    primary_key=("key_id",),
    since=3,
)
TABLES = (REQUESTS, OUTCOMES, KEYS)

#: Statements a version needs beyond creating tables and adding ``since`` columns.
_EXTRA_DDL: dict[int, tuple[str, ...]] = {
    # Authentication looks keys up by hash; two keys with one hash must be impossible.
    3: ("CREATE UNIQUE INDEX IF NOT EXISTS keys_hash_idx ON keys (key_hash)",),
    # No query filters on the backend: the index cost a third of each logged row's insert.
    4: ("DROP INDEX IF EXISTS requests_chosen_model_ts_idx",),
}

SCHEMA_VERSION = max(
    [1, *_EXTRA_DDL, *(t.since for t in TABLES), *(c.since for t in TABLES for c in t.columns)]
)


def version_table_ddl(dialect: Dialect) -> str:
    real = _TYPES[dialect]["float"]
    return (
        "CREATE TABLE IF NOT EXISTS schema_version "
        f"(version INTEGER PRIMARY KEY NOT NULL, applied_at {real} NOT NULL)"
    )


def _column_ddl(col: Column, dialect: Dialect) -> str:
    return f"{col.name} {_TYPES[dialect][col.kind]}" + (" NOT NULL" if col.not_null else "")


def _create_table(table: Table, dialect: Dialect) -> list[str]:
    cols = [_column_ddl(c, dialect) for c in table.columns if c.since <= table.since]
    cols.append(f"PRIMARY KEY ({', '.join(table.primary_key)})")
    stmts = [f"CREATE TABLE IF NOT EXISTS {table.name} ({', '.join(cols)})"]
    stmts += [
        f"CREATE INDEX IF NOT EXISTS {name} ON {table.name} ({', '.join(cols_)})"
        for name, cols_ in table.indexes
    ]
    return stmts


def migrations(dialect: Dialect) -> list[tuple[int, list[str]]]:
    """Ordered ``(version, statements)``; each version runs once, in one transaction."""
    out: list[tuple[int, list[str]]] = []
    for version in range(1, SCHEMA_VERSION + 1):
        stmts: list[str] = []
        for table in TABLES:
            if version == table.since:
                stmts += _create_table(table, dialect)
            stmts += [
                f"ALTER TABLE {table.name} ADD COLUMN {_column_ddl(c, dialect)}"
                for c in table.columns
                if c.since == version and version > table.since
            ]
        stmts += _EXTRA_DDL.get(version, ())
        out.append((version, stmts))
    return out


def missing_columns(table: Table, present: Iterable[str]) -> list[str]:
    have = set(present)
    return [n for n in table.names if n not in have]


def _ph(dialect: Dialect) -> str:
    return "?" if dialect == "sqlite" else "%s"


def insert_requests_sql(dialect: Dialect) -> str:
    # DO NOTHING makes a retried batch harmless when the first attempt did commit.
    names = REQUESTS.names
    marks = ", ".join([_ph(dialect)] * len(names))
    return f"INSERT INTO requests ({', '.join(names)}) VALUES ({marks}) ON CONFLICT (request_id) DO NOTHING"


def upsert_outcome_sql(dialect: Dialect) -> str:
    names = OUTCOMES.names
    marks = ", ".join([_ph(dialect)] * len(names))
    updates = ", ".join(f"{n} = excluded.{n}" for n in names if n not in OUTCOMES.primary_key)
    pk = ", ".join(OUTCOMES.primary_key)
    return (
        f"INSERT INTO outcomes ({', '.join(names)}) VALUES ({marks}) "
        f"ON CONFLICT ({pk}) DO UPDATE SET {updates}"
    )


def select_sql(
    table: Table,
    dialect: Dialect,
    where: str | None = None,
    order: str | None = None,
    op: str = "=",
    limit: int | None = None,
) -> str:
    """``where`` is a column name compared (``op``: ``=`` or ``>=``) with one parameter."""
    assert op in ("=", ">="), op
    sql = f"SELECT {', '.join(table.names)} FROM {table.name}"
    if where:
        sql += f" WHERE {where} {op} {_ph(dialect)}"
    if order:
        sql += f" ORDER BY {order}"
    if limit is not None:
        sql += f" LIMIT {int(limit)}"
    return sql


def _clean_text(value: str) -> str:
    # PostgreSQL TEXT rejects NUL and both drivers reject lone surrogates; one bad byte in a
    # prompt must not make the whole batch unwritable.
    if "\x00" in value:
        value = value.replace("\x00", "\ufffd")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            value = value.encode("utf-8", "replace").decode("utf-8")
    return value


def _json_default(value: Any) -> Any:
    # The records a JSON column holds say what of them is written (an Estimate leaves out its None fields).
    if isinstance(value, Estimate | TryRecord):
        return value.as_json()
    if is_dataclass(value) and not isinstance(value, type):  # as orjson writes one by itself
        return asdict(value)
    return str(value)


def _encode_json(value: Any) -> str:
    try:
        options = orjson.OPT_NON_STR_KEYS | orjson.OPT_PASSTHROUGH_DATACLASS
        return orjson.dumps(value, default=_json_default, option=options).decode()
    except (TypeError, orjson.JSONEncodeError):
        return _clean_text(json.dumps(value, default=_json_default, ensure_ascii=False))


def _encode(col: Column, value: Any) -> Any:
    if value is None:
        return None
    if col.kind == "text":
        return _clean_text(value if isinstance(value, str) else str(value))
    if col.kind == "bool":
        return 1 if value else 0
    if col.kind == "int":
        out = int(value)
        if not -_INT64 <= out < _INT64:
            raise ValueError(f"{out} does not fit in 64 bits")
        return out
    if col.kind == "float":
        return float(value)
    return _encode_json(value)


def _encode_values(table: Table, values: Sequence[Any], key: str) -> tuple[Any, ...]:
    # Every request is encoded once, when it ends (after its reply): most values are None, or
    # already what the driver takes (a short ASCII str, an int, a float), so those are kept as
    # they are and only the rest go through _encode.
    if len(values) != len(table.columns):
        raise ValueError(f"{table.name} row {key!r}: {len(values)} values for {len(table.columns)} columns")
    out = list(values)
    kinds = table.kinds
    for i, value in enumerate(values):
        if value is None:
            continue
        kind = kinds[i]
        if (kind == "float" and type(value) is float) or (
            kind == "text" and type(value) is str and value.isascii() and "\x00" not in value
        ):
            continue
        col = table.columns[i]
        try:
            out[i] = _encode(col, value)
        except (TypeError, ValueError, OverflowError) as exc:
            raise StoreDataError(f"{table.name} row {key!r}: column {col.name}: {exc}") from exc
    return tuple(out)


def encode_request(rec: RequestRecord) -> tuple[Any, ...]:
    """The request's row, as ``Store.write_rows`` takes it; ``StoreDataError`` if a value cannot be stored."""
    return _encode_values(REQUESTS, REQUESTS.values_of(rec), rec.request_id)


_REQUEST_ID = REQUESTS.names.index("request_id")


def request_id_of(row: Sequence[Any]) -> str:
    """The request id of a row made by ``encode_request``."""
    return str(row[_REQUEST_ID])


def insert_key_sql(dialect: Dialect) -> str:
    names = KEYS.names
    return f"INSERT INTO keys ({', '.join(names)}) VALUES ({', '.join([_ph(dialect)] * len(names))})"


def revoke_key_sql(dialect: Dialect) -> str:
    """Parameters: revoked_at, key_id. Revoking twice keeps the first time."""
    ph = _ph(dialect)
    return f"UPDATE keys SET revoked_at = {ph} WHERE key_id = {ph} AND revoked_at IS NULL"


def encode_key(rec: KeyRecord) -> tuple[Any, ...]:
    return _encode_values(KEYS, KEYS.values_of(rec), rec.key_id)


def encode_outcome(rec: OutcomeRecord) -> tuple[Any, ...]:
    values = list(OUTCOMES.values_of(rec))
    values[OUTCOMES.names.index("attempt")] = 0 if rec.attempt is None else rec.attempt
    return _encode_values(OUTCOMES, values, rec.task_id)


_OUTCOME_KEY = tuple(OUTCOMES.names.index(n) for n in OUTCOMES.primary_key)


def outcome_key(row: Sequence[Any]) -> tuple[Any, ...]:
    """The primary key (task_id, attempt, source) of an encoded outcome row."""
    return tuple(row[i] for i in _OUTCOME_KEY)


def spend_sql(column: str, dialect: Dialect, one: bool = False) -> str:
    """Total cost per value of ``key_id`` or ``task_id`` (what in-process budgets restart from),
    of the values with a request at or after the last parameter (a budget scope idle longer is
    forgotten); with ``one``, of the one value given as the first parameter."""
    if column not in ("key_id", "task_id"):
        raise ValueError(f"no spend by {column!r}")
    ph = _ph(dialect)
    where = f"{column} = {ph}" if one else f"{column} IS NOT NULL"
    # Every request touches its scopes, refused ones too (no cost), so the latest of any row is
    # when the scope was last used: a key refused daily for its spent budget is not forgotten.
    return (
        f"SELECT {column}, SUM(cost_usd) FROM requests WHERE {where} GROUP BY {column} "
        f"HAVING MAX(ts) >= {ph} AND SUM(cost_usd) > 0"
    )


#: The ``endpoint`` of the rows ``router prune`` leaves in place of the requests it deletes.
PRUNED = "(pruned)"


def prune_sql(dialect: Dialect) -> list[str]:
    """``router prune``, in one transaction; each statement takes (cutoff, cutoff as text) or (cutoff,).

    Budgets restarted from the log sum ``cost_usd`` per key and per task (``spend_sql``), so the
    requests before the cutoff are first folded into one row per (key, task) with their summed cost
    and their latest ``ts`` (when the scope was last used, as the sum reads it); the rows of an
    earlier prune are folded again. Then every older request, and every older outcome, goes."""
    ph = _ph(dialect)
    summary = (
        f"INSERT INTO requests (request_id, ts, key_id, task_id, cost_usd, endpoint, side_call, stream, "
        f"usage_estimated) SELECT 'pruned-' || CAST({ph} AS TEXT) || '-' || COALESCE(key_id, '') || '/' || "
        f"COALESCE(task_id, ''), MAX(ts), key_id, task_id, SUM(cost_usd), '{PRUNED}', 0, 0, 0 FROM requests "
        f"WHERE ts < {ph} AND (key_id IS NOT NULL OR task_id IS NOT NULL) GROUP BY key_id, task_id "
        "HAVING SUM(cost_usd) > 0"
    )
    return [
        summary,
        f"DELETE FROM requests WHERE ts < {ph} AND request_id NOT LIKE 'pruned-' || CAST({ph} AS TEXT) || "
        f"'-{'%%' if dialect == 'postgres' else '%'}'",  # psycopg reads a lone % as a placeholder
        f"DELETE FROM outcomes WHERE ts < {ph}",
    ]


def count_before_sql(dialect: Dialect) -> str:
    return f"SELECT COUNT(*) FROM requests WHERE ts < {_ph(dialect)} AND (endpoint IS NULL OR endpoint <> '{PRUNED}')"
