"""Log rows read back as the records they were written from (``router.store.records``).

Readers use attributes (``r.cost_usd``), not column names in strings: a misspelt or removed
column is then a type error, not a silent ``None``. A row is decoded in place of the dict it used
to be, for as many rows as a dashboard or a preview reads: only the columns whose stored form
differs (booleans stored as 0/1, JSON stored as text) are touched, and the record is built from
the row's values in field order. A JSON column of records (``candidates``, ``tries``) is read back
as those records (``RecordsOf``).

A query may leave out columns it does not need (``request_rows(without=...)``: a logged prompt is
by far the largest column, the decision's candidates the largest JSON): the record keeps the
field's default for them, so only the reader that chose what to leave out may take such records.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Sequence
from dataclasses import MISSING, fields, replace
from typing import Any, Final, Generic, TypeVar, cast

import orjson

from router.store.records import Estimate, KeyRecord, OutcomeRecord, RequestRecord, TryRecord
from router.store.schema import KEYS, OUTCOMES, REQUESTS, Table

R = TypeVar("R", RequestRecord, OutcomeRecord, KeyRecord)
T = TypeVar("T")


def decode_json(raw: Any) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        try:
            return json.loads(raw)
        except ValueError:
            return raw  # unreadable JSON is still worth showing rather than failing the whole query


class RecordsOf(Generic[T]):
    """A JSON column's list of ``kind`` records, from its decoded JSON. Keys the record does not
    have (another version's) are ignored; an item that is not an object or lacks a key the record
    needs is left out (as a row that is not a list is: None), so one bad row never fails a query."""

    def __init__(self, kind: type[T]) -> None:
        self.kind = kind
        self.names = frozenset(f.name for f in fields(cast(Any, kind)))

    def __call__(self, value: Any) -> list[T] | None:
        if not isinstance(value, list):
            return None
        kind, names = self.kind, self.names
        out = []
        for item in value:
            if isinstance(item, dict):
                try:
                    out.append(kind(**{k: v for k, v in item.items() if k in names}))
                except TypeError:
                    continue
        return out


#: The JSON columns that hold records (``RequestRecord.candidates``, ``.tries``), by name.
_RECORD_COLUMNS: Final[dict[str, Callable[[Any], Any]]] = {
    "candidates": RecordsOf(Estimate),
    "tries": RecordsOf(TryRecord),
}


class Decoder(Generic[R]):
    """Rows of ``table`` with the columns ``names`` (in that order; all of them by default) → records.

    ``table`` is then the table of those columns only, what a query selects."""

    def __init__(self, table: Table, record: type[R], names: Sequence[str] | None = None) -> None:
        self.record: type[R] = record
        self.names = tuple(table.names if names is None else names)
        kinds = {c.name: c.kind for c in table.columns}
        unknown = [n for n in self.names if n not in kinds]
        if unknown:
            raise ValueError(f"{table.name} has no columns {unknown}")
        by_name = {c.name: c for c in table.columns}
        self.table = replace(table, columns=tuple(by_name[n] for n in self.names))
        required = [f.name for f in fields(record) if f.default is MISSING and f.default_factory is MISSING]
        if missing := [n for n in required if n not in self.names]:
            raise ValueError(f"a {record.__name__} needs the columns {missing}")
        self._bools = tuple(i for i, n in enumerate(self.names) if kinds[n] == "bool")
        self._json = tuple(i for i, n in enumerate(self.names) if kinds[n] == "json")
        self._records = tuple(
            (i, _RECORD_COLUMNS[n]) for i, n in enumerate(self.names) if n in _RECORD_COLUMNS
        )
        # Both drivers return REAL / DOUBLE PRECISION as float; anything else (an integer a
        # foreign writer put in SQLite's dynamic typing) is made one.
        self._floats = tuple(i for i, n in enumerate(self.names) if kinds[n] == "float")
        self._full = self.names == table.names
        order = [f.name for f in fields(record)]
        self._slots = tuple(order.index(n) for n in self.names)
        self._template = [f.default for f in fields(record)]

    def _values(self, row: Sequence[Any]) -> list[Any]:
        values = list(row)
        for i in self._bools:
            v = values[i]
            if v is not None:
                values[i] = bool(v)
        for i in self._json:
            v = values[i]
            if v is not None:
                values[i] = decode_json(v)
        for i, read in self._records:
            v = values[i]
            if v is not None:
                values[i] = read(v)
        for i in self._floats:
            v = values[i]
            if v is not None and type(v) is not float:
                values[i] = float(v)
        return values

    def one(self, row: Sequence[Any]) -> R:
        values = self._values(row)
        if not self._full:
            full = self._template.copy()
            for slot, v in zip(self._slots, values, strict=True):
                full[slot] = v
            values = full
        return self.record(*values)

    def all(self, rows: Sequence[Sequence[Any]]) -> list[R]:
        one = self.one
        return [one(row) for row in rows]


REQUEST_ROWS = Decoder(REQUESTS, RequestRecord)
OUTCOME_ROWS = Decoder(OUTCOMES, OutcomeRecord)
KEY_ROWS = Decoder(KEYS, KeyRecord)


@functools.cache
def request_rows(without: frozenset[str] = frozenset()) -> Decoder[RequestRecord]:
    """The decoder of request rows that leave out the columns ``without``."""
    if not without:
        return REQUEST_ROWS
    return Decoder(REQUESTS, RequestRecord, [n for n in REQUESTS.names if n not in without])
