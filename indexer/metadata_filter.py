"""Search filters on item metadata (issue 43): equality, "in" and numeric ranges on the item id
or any field of its `extra` JSON, checked in SQL over a version's metadata.sqlite and in Python
over live in-memory records, with the same answer for both.

The request form maps field names to conditions, all of which must hold:
    {"split": "test", "labels": {"in": ["apple", "pear"]}, "year": {"gte": 2000, "lt": 2010}}
A condition on a list field holds when any element satisfies it; a missing field never matches.
"""

from __future__ import annotations

import json
import math
import re
import sqlite3
from dataclasses import dataclass
from typing import Any

import numpy as np

MAX_FIELDS = 32
MAX_VALUES = 1024
ID_FIELD = "id"
FIELD_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
LOWER_OPS = ("gte", "gt")
UPPER_OPS = ("lte", "lt")
INT64 = (-(2**63), 2**63 - 1)
FORMS = (
    'a value (string, number or boolean), {"in": [values]}, or a range such as '
    '{"gte": 1, "lt": 5} (operators "gte", "gt", "lte", "lt")'
)

Scalar = str | int | float | bool


class FilterError(ValueError):
    """A filter the client sent is malformed; the message says what to send instead."""


@dataclass(frozen=True)
class OneOf:
    """The field equals one of these values (numbers compare by value: 1 matches 1.0;
    booleans only match booleans)."""

    texts: frozenset[str]
    numbers: frozenset[int | float]
    bools: frozenset[bool]

    def accepts(self, value: Any) -> bool:
        if isinstance(value, bool):
            return value in self.bools
        if isinstance(value, int | float):
            return value in self.numbers
        return isinstance(value, str) and value in self.texts

    def sql(self) -> tuple[str, list[Any]]:
        """A test of one json_each row `e`, and its parameters."""
        parts, params = [], []
        if self.texts:
            parts.append("(e.type = 'text' AND e.atom IN (SELECT value FROM json_each(?)))")
            params.append(json.dumps(sorted(self.texts)))
        if self.numbers:
            parts.append(
                "(e.type IN ('integer', 'real') AND e.atom IN (SELECT value FROM json_each(?)))"
            )
            params.append(json.dumps(sorted(self.numbers)))
        if self.bools:
            parts.append("e.type IN (SELECT value FROM json_each(?))")
            params.append(json.dumps(sorted(json.dumps(b) for b in self.bools)))
        return "(" + (" OR ".join(parts) or "0") + ")", params  # no value: nothing matches

    def canonical(self) -> dict[str, Any]:
        values = sorted(self.bools) + sorted(self.numbers) + sorted(self.texts)
        return {"in": values}

    def describe(self) -> str:
        values = [json.dumps(v, ensure_ascii=False) for v in self.canonical()["in"]]
        if not values:
            return "= (a value no item can hold)"
        return f"= {values[0]}" if len(values) == 1 else f"in ({', '.join(values)})"


@dataclass(frozen=True)
class Range:
    """lo < value < hi (<= where not strict) for numeric values only; None: unbounded."""

    lo: int | float | None
    lo_strict: bool
    hi: int | float | None
    hi_strict: bool

    def accepts(self, value: Any) -> bool:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False
        above = self.lo is None or (value > self.lo if self.lo_strict else value >= self.lo)
        below = self.hi is None or (value < self.hi if self.hi_strict else value <= self.hi)
        return above and below

    def sql(self) -> tuple[str, list[Any]]:
        """A test of one json_each row `e`, and its parameters."""
        parts, params = ["e.type IN ('integer', 'real')"], []
        if self.lo is not None:
            parts.append("e.atom > ?" if self.lo_strict else "e.atom >= ?")
            params.append(self.lo)
        if self.hi is not None:
            parts.append("e.atom < ?" if self.hi_strict else "e.atom <= ?")
            params.append(self.hi)
        return "(" + " AND ".join(parts) + ")", params

    def canonical(self) -> dict[str, Any]:
        bounds = {}
        if self.lo is not None:
            bounds["gt" if self.lo_strict else "gte"] = self.lo
        if self.hi is not None:
            bounds["lt" if self.hi_strict else "lte"] = self.hi
        return bounds

    def describe(self) -> str:
        return " and ".join(f"{_SYMBOLS[op]} {v}" for op, v in self.canonical().items())


_SCALAR = {"anyOf": [{"type": "string"}, {"type": "number"}, {"type": "boolean"}]}
_RANGE = {
    "type": "object",
    "properties": {op: {"type": "number"} for op in (*LOWER_OPS, *UPPER_OPS)},
    "minProperties": 1,
    "additionalProperties": False,
    "not": {"anyOf": [{"required": list(LOWER_OPS)}, {"required": list(UPPER_OPS)}]},
}


def _one_of_schema(scalar: dict[str, Any]) -> dict[str, Any]:
    values = {"type": "array", "items": scalar, "minItems": 1, "maxItems": MAX_VALUES}
    return {
        "type": "object",
        "properties": {"in": values},
        "required": ["in"],
        "additionalProperties": False,
    }


# The request form as JSON Schema (the served OpenAPI's `filter`): every filter it calls valid
# is parsed, so the schema and MetadataFilter.parse say the same.
FILTER_JSON_SCHEMA: dict[str, Any] = {
    "type": "object",
    "maxProperties": MAX_FIELDS,
    "propertyNames": {"pattern": "^" + FIELD_NAME.pattern + "$"},
    "properties": {ID_FIELD: {"anyOf": [{"type": "string"}, _one_of_schema({"type": "string"})]}},
    "additionalProperties": {"anyOf": [*_SCALAR["anyOf"], _one_of_schema(_SCALAR), _RANGE]},
}

_SYMBOLS = {"gte": ">=", "gt": ">", "lte": "<=", "lt": "<"}
Condition = OneOf | Range


@dataclass(frozen=True)
class MetadataFilter:
    """Conditions on item fields, all of which must hold; no conditions match every item."""

    conditions: tuple[tuple[str, Condition], ...]

    @classmethod
    def parse(cls, spec: object) -> MetadataFilter:
        """The filter of a request's JSON `filter` object; FilterError if malformed."""
        if not isinstance(spec, dict):
            raise FilterError(
                f"a filter must be a JSON object mapping field names to conditions, such as "
                f'{{"split": "test"}}; got {_json_kind(spec)}'
            )
        if len(spec) > MAX_FIELDS:
            raise FilterError(f"a filter may name at most {MAX_FIELDS} fields; got {len(spec)}")
        return cls(tuple((_field_name(f), _condition(f, spec[f])) for f in sorted(spec)))

    def matches(self, record: dict[str, Any]) -> bool:
        """Whether an in-memory record {"id", "extra"?, ...} passes the filter."""
        return all(
            any(cond.accepts(v) for v in _values(record, field)) for field, cond in self.conditions
        )

    def matching_rows(self, db: sqlite3.Connection, count: int) -> np.ndarray:
        """(count,) bool mask of the rows of metadata.sqlite's `items` that pass the filter,
        computed by one SQL query."""
        if not self.conditions:
            return np.ones(count, dtype=bool)
        where, params = self.sql()
        found = db.execute(f"SELECT group_concat(row) FROM items WHERE {where}", params)
        joined = found.fetchone()[0]
        mask = np.zeros(count, dtype=bool)
        if joined:
            mask[np.array(joined.split(","), dtype=np.int64)] = True
        return mask

    def sql(self) -> tuple[str, list[Any]]:
        """The WHERE clause over table `items`, and its parameters ("1" for no conditions)."""
        clauses, params = [], []
        for field, cond in self.conditions:
            clause, values = _field_sql(field, cond)
            clauses.append(clause)
            params += values
        return " AND ".join(clauses) or "1", params

    def describe(self) -> str:
        """Short human text, e.g. 'labels = "apple" and year >= 2000 and < 2010'."""
        if not self.conditions:
            return "every item"
        return " and ".join(f"{field} {cond.describe()}" for field, cond in self.conditions)

    def cache_key(self) -> str:
        """Canonical JSON: equal for filters that differ only in key or value order,
        duplicates, equality written as a one-value "in", or 2.0 written for 2."""
        canonical = {field: cond.canonical() for field, cond in self.conditions}
        return json.dumps(canonical, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _field_sql(field: str, cond: Condition) -> tuple[str, list[Any]]:
    """json_each walks a list's elements (integer keys), a scalar itself (key NULL), or an
    object's members (text keys), which must not match."""
    if field == ID_FIELD:
        assert isinstance(cond, OneOf)
        return "items.id IN (SELECT value FROM json_each(?))", [json.dumps(sorted(cond.texts))]
    test, params = cond.sql()
    clause = (
        "EXISTS (SELECT 1 FROM json_each(items.extra, ?) AS e"
        f" WHERE typeof(e.key) <> 'text' AND {test})"
    )
    return clause, [f'$."{field}"', *params]


def _values(record: dict[str, Any], field: str) -> list[Any]:
    """The scalars a condition on `field` is checked against, as SQLite's JSON functions see
    them: a list's elements, nothing for an object or a missing field."""
    if field == ID_FIELD:
        return [record[ID_FIELD]] if ID_FIELD in record else []
    value = (record.get("extra") or {}).get(field)
    if isinstance(value, dict):
        return []
    return [_as_sqlite_sees(v) for v in (value if isinstance(value, list) else [value])]


def _as_sqlite_sees(value: Any) -> Any:
    """SQLite's JSON functions end a string at its first NUL and read integers beyond 64 bits
    as floats (infinite past the float range)."""
    if isinstance(value, str):
        return value.split("\x00", 1)[0]
    if isinstance(value, bool) or not isinstance(value, int) or INT64[0] <= value <= INT64[1]:
        return value
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def _field_name(field: object) -> str:
    if not isinstance(field, str) or not FIELD_NAME.fullmatch(field):
        raise FilterError(
            f"filter field {field!r} is not a field name: use 'id' or a metadata key of 1 to 64 "
            "letters, digits, '_' or '-' (nested fields are not supported)"
        )
    return field


def _condition(field: str, spec: object) -> Condition:
    if isinstance(spec, dict):
        cond = _one_of(field, spec) if "in" in spec else _range(field, spec)
    else:
        cond = _one_of_values(field, [_scalar(field, spec)])
    if field == ID_FIELD and (not isinstance(cond, OneOf) or cond.numbers or cond.bools):
        raise FilterError(
            'filter field "id": item ids are strings; send {"id": "<id>"} or '
            '{"id": {"in": ["<id>", ...]}}'
        )
    return cond


def _one_of(field: str, spec: dict[str, Any]) -> OneOf:
    if len(spec) > 1:
        others = sorted(k for k in spec if k != "in")
        raise FilterError(
            f'filter field {field!r}: "in" cannot be combined with {others}; send either '
            '{"in": [values]} or a range'
        )
    values = spec["in"]
    if not isinstance(values, list) or not values:
        raise FilterError(
            f'filter field {field!r}: "in" takes a non-empty list of values, such as '
            '{"in": ["a", "b"]}'
        )
    if len(values) > MAX_VALUES:
        raise FilterError(
            f'filter field {field!r}: "in" takes at most {MAX_VALUES} values; got {len(values)}'
        )
    return _one_of_values(field, [_scalar(field, v) for v in values])


def _one_of_values(field: str, values: list[Scalar]) -> OneOf:
    """The values; a string holding NUL or an unpaired surrogate can equal no stored value
    (SQLite ends strings at NUL; stored metadata is valid Unicode), so it matches nothing."""
    return OneOf(
        texts=frozenset(
            v for v in values if isinstance(v, str) and "\x00" not in v and _is_unicode(v)
        ),
        numbers=frozenset(  # no stored number is infinite (metadata stores them as null)
            n for v in values if _is_number(v) and math.isfinite(n := _number(field, v))
        ),
        bools=frozenset(v for v in values if isinstance(v, bool)),
    )


def _range(field: str, spec: dict[str, Any]) -> Range:
    unknown = sorted(set(spec) - {*LOWER_OPS, *UPPER_OPS})
    if unknown or not spec:
        got = f"unknown operator {unknown[0]!r}" if unknown else "an empty object"
        raise FilterError(f"filter field {field!r}: {got}; send {FORMS}")
    lo_op, lo = _bound(field, spec, LOWER_OPS)
    hi_op, hi = _bound(field, spec, UPPER_OPS)
    return Range(lo, lo_op == "gt", hi, hi_op == "lt")  # an empty range matches nothing


def _bound(field: str, spec: dict[str, Any], ops: tuple[str, str]) -> tuple[str, Any]:
    given = [op for op in ops if op in spec]
    if len(given) > 1:
        raise FilterError(
            f'filter field {field!r}: give one of "{ops[0]}" and "{ops[1]}", not both'
        )
    if not given:
        return "", None
    value = spec[given[0]]
    if not _is_number(value):
        raise FilterError(
            f'filter field {field!r}: "{given[0]}" takes a number, such as {{"{given[0]}": 10}};'
            f" got {json.dumps(value)}"
        )
    return given[0], _number(field, value)


def _scalar(field: str, value: object) -> Scalar:
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or _is_number(value):
        return value
    raise FilterError(
        f"filter field {field!r}: {_json_kind(value)} is not a value to filter on; send {FORMS}"
    )


def _json_kind(value: object) -> str:
    kinds = {type(None): "null", dict: "an object", list: "a list"}
    return kinds.get(type(value), type(value).__name__)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _number(field: str, value: int | float) -> int | float:
    """The number, integral floats as ints (2.0 -> 2: the same matches, one cache key)."""
    if isinstance(value, float):
        if math.isnan(value):
            raise FilterError(f"filter field {field!r}: numbers must not be NaN")
        if value.is_integer() and INT64[0] <= value <= INT64[1]:
            return int(value)
        return value
    if not INT64[0] <= value <= INT64[1]:
        return _number(field, float(_as_sqlite_sees(value)))  # as SQLite reads it
    return value


def _is_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
