"""indexer.metadata_filter: SQL over metadata.sqlite and Python over in-memory records give the
same answer, and every malformed filter is refused with a message saying what to send."""

import sqlite3
import tempfile
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from indexer.metadata_filter import (
    FILTER_JSON_SCHEMA,
    MAX_FIELDS,
    MAX_VALUES,
    FilterError,
    MetadataFilter,
)
from indexer.store import MetadataReader
from indexer.version_writer import MetadataWriter

PICTURES = [
    {"id": "p0", "uri": "a.png", "extra": {"split": "test", "labels": ["apple", "fruit"]}},
    {"id": "p1", "uri": "b.png", "extra": {"split": "train", "labels": ["pear", "fruit"]}},
    {"id": "p2", "uri": "c.png", "extra": {"split": "test", "labels": ["car"], "year": 2001}},
    {"id": "c0", "text": "an apple", "extra": {"split": "train", "image_id": "p0"}},
    {"id": "u0", "text": "odd", "extra": {"year": 2001.0, "flag": True, "n": 1, "id": "p0"}},
    {"id": "u1", "text": "odder", "extra": {"year": "2001", "flag": 1, "labels": {"a": "apple"}}},
]


def write_metadata(path: Path, records: list[dict[str, Any]]) -> Path:
    writer = MetadataWriter(path)
    writer.add(records)
    writer.close()
    return path


def rows_matching(spec: object, records: list[dict[str, Any]], tmp: Path) -> list[str]:
    """The ids of the rows matching_rows finds, after checking matches() finds the same."""
    flt = MetadataFilter.parse(spec)
    db = sqlite3.connect(write_metadata(Path(tempfile.mkdtemp(dir=tmp)) / "m.sqlite", records))
    mask = flt.matching_rows(db, len(records))
    db.close()
    assert mask.tolist() == [flt.matches(r) for r in records]
    return [r["id"] for r, m in zip(records, mask, strict=True) if m]


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"labels": "apple"}, ["p0"]),
        ({"labels": {"in": ["pear", "car"]}}, ["p1", "p2"]),
        ({"labels": "fruit", "split": "test"}, ["p0"]),
        ({"split": {"in": ["train"]}}, ["p1", "c0"]),
        ({"image_id": "p0"}, ["c0"]),
        ({"year": 2001}, ["p2", "u0"]),
        ({"year": {"gte": 2000.5, "lt": 2002}}, ["p2", "u0"]),
        ({"year": {"gt": 2001}}, []),
        ({"year": "2001"}, ["u1"]),
        ({"flag": True}, ["u0"]),
        ({"flag": 1}, ["u1"]),
        ({"n": {"lte": 1}}, ["u0"]),
        ({"flag": {"gte": 0}}, ["u1"]),
        ({"id": "p0"}, ["p0"]),
        ({"id": {"in": ["c0", "u1", "nobody"]}}, ["c0", "u1"]),
        ({"missing": "x"}, []),
        ({}, ["p0", "p1", "p2", "c0", "u0", "u1"]),
    ],
)
def test_pictures_and_captions(spec: object, expected: list[str], tmp_path: Path) -> None:
    """Lists match on any element, 1 == 1.0 but not True, a range skips strings and booleans,
    "id" is the item id (not extra's "id"), an object field never matches."""
    assert rows_matching(spec, PICTURES, tmp_path) == expected


ODD_VALUES = [
    {"id": "x", "extra": {"a": 2**63 + 1}},
    {"id": "y", "extra": {"a": [-(2**63) - 1]}},
    {"id": "z", "extra": {"a": 10**400}},
    {"id": "n", "extra": {"a": "a\x00b"}},
]


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"a": float(2**63)}, ["x"]),
        ({"a": -(2**63)}, ["y"]),
        ({"a": {"gte": 2**63 - 1}}, ["x", "z"]),
        ({"a": {"lt": -(2**63)}}, []),
        ({"a": {"lte": -(2**63)}}, ["y"]),
        ({"a": "a"}, ["n"]),
    ],
)
def test_values_as_sqlite_reads_them(spec: object, expected: list[str], tmp_path: Path) -> None:
    """Integers beyond 64 bits compare as the nearest float, and a string ends at a NUL, in
    matches() as in SQLite's JSON functions."""
    assert rows_matching(spec, ODD_VALUES, tmp_path) == expected


def test_values_are_parameters_not_sql(tmp_path: Path) -> None:
    records = [{"id": "x'; DROP TABLE items; --", "extra": {"k": "a' OR '1'='1"}}]
    assert rows_matching({"k": "a' OR '1'='1"}, records, tmp_path) == [records[0]["id"]]
    assert rows_matching({"id": records[0]["id"], "k": "a"}, records, tmp_path) == []


def test_read_only_connection_of_a_version(tmp_path: Path) -> None:
    """The service's MetadataReader connection (read-only, immutable) answers as well."""
    reader = MetadataReader(write_metadata(tmp_path / "metadata.sqlite", PICTURES))
    with reader.lock:
        mask = MetadataFilter.parse({"labels": "fruit"}).matching_rows(reader.db, reader.count)
    reader.close()
    assert np.flatnonzero(mask).tolist() == [0, 1]


def test_cache_key_and_describe() -> None:
    one = MetadataFilter.parse({"b": {"in": ["y", "x", "x"]}, "a": {"lt": 3.0, "gte": 1}})
    two = MetadataFilter.parse({"a": {"gte": 1.0, "lt": 3}, "b": {"in": ["x", "y"]}})
    assert one == two
    assert one.cache_key() == two.cache_key() == '{"a":{"gte":1,"lt":3},"b":{"in":["x","y"]}}'
    assert (
        MetadataFilter.parse({"a": 2}).cache_key()
        == MetadataFilter.parse({"a": {"in": [2.0]}}).cache_key()
    )
    assert (
        MetadataFilter.parse({"a": True}).cache_key() != MetadataFilter.parse({"a": 1}).cache_key()
    )
    assert one.describe() == 'a >= 1 and < 3 and b in ("x", "y")'
    assert MetadataFilter.parse({"labels": "apple"}).describe() == 'labels = "apple"'
    assert MetadataFilter.parse({}).describe() == "every item"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (["split", "test"], "must be a JSON object mapping field names.*got a list"),
        (None, "must be a JSON object.*got null"),
        ({"a.b": 1}, "'a.b' is not a field name: use 'id' or a metadata key of 1 to 64"),
        ({"": 1}, "'' is not a field name"),
        ({"x" * 65: 1}, "is not a field name"),
        ({"a": {"eq": 1}}, 'unknown operator \'eq\'; send a value .*"in".*"gte"'),
        ({"a": {}}, "an empty object; send a value"),
        ({"a": {"in": []}}, '"in" takes a non-empty list of values'),
        ({"a": {"in": "x"}}, '"in" takes a non-empty list of values'),
        ({"a": {"in": list(range(MAX_VALUES + 1))}}, f"at most {MAX_VALUES} values; got 1025"),
        ({"a": {"in": [1], "gte": 0}}, r"\"in\" cannot be combined with \['gte'\]"),
        ({"a": None}, "null is not a value to filter on; send a value"),
        ({"a": [1, 2]}, 'a list is not a value to filter on; send .*{"in": \\[values\\]}'),
        ({"a": {"in": [{"b": 1}]}}, "an object is not a value to filter on"),
        ({"a": {"in": [[1]]}}, "a list is not a value to filter on"),
        ({"a": {"gte": 1, "gt": 1}}, 'give one of "gte" and "gt", not both'),
        ({"a": {"lt": "5"}}, '"lt" takes a number, such as {"lt": 10}; got "5"'),
        ({"a": {"gte": True}}, '"gte" takes a number, such as {"gte": 10}; got true'),
        ({"a": float("nan")}, "numbers must not be NaN"),
        ({"id": 5}, 'item ids are strings; send {"id": "<id>"}'),
        ({"id": {"in": ["a", 1]}}, "item ids are strings"),
        ({"id": {"gte": 1}}, "item ids are strings"),
        ({f"f{i}": 1 for i in range(MAX_FIELDS + 1)}, f"at most {MAX_FIELDS} fields; got 33"),
    ],
)
def test_malformed_filters_are_refused(spec: object, message: str) -> None:
    with pytest.raises(FilterError, match=message):
        MetadataFilter.parse(spec)


def test_filter_error_is_a_value_error() -> None:
    assert issubclass(FilterError, ValueError)


# Few distinct values, so that random filters hit random records often.
TEXTS = st.sampled_from(["", "a", "b", "\u00e9", "a\U0001f600"])
NUMBERS = st.sampled_from(
    [0, 1, 2, -1, 0.0, -0.0, 0.5, 1.0, 2.0, 1e300, float(2**63), -(2**63), float(2**70)]
)
FILTER_SCALARS = st.one_of(TEXTS, NUMBERS, st.integers(-3, 3), st.booleans())
# SQLite reads integers beyond 64 bits as the nearest float: 2**63 + 1 equals float(2**63) there.
BIG_INTS = st.sampled_from(
    [2**63 - 1, 2**63, 2**63 + 1, -(2**63), -(2**63) - 1, 2**70 + 1, 10**400, -(10**400)]
)
RECORD_SCALARS = st.one_of(
    FILTER_SCALARS,
    st.builds(lambda head, tail: f"{head}\x00{tail}", TEXTS, TEXTS),
    st.floats(allow_nan=False, allow_infinity=False),
    BIG_INTS,
    st.none(),
)
RECORD_VALUES = st.one_of(
    RECORD_SCALARS,
    st.lists(st.one_of(RECORD_SCALARS, st.lists(RECORD_SCALARS, max_size=2)), max_size=4),
    st.dictionaries(st.sampled_from(["a", "0"]), RECORD_SCALARS, max_size=2),
)
FIELDS = ["a", "b-c", "id", "labels"]
IDS = st.sampled_from(["a", "b", "0", "1", "true", "\U0001f600", "a\x00b"])
BOUND = st.one_of(st.integers(-3, 3), st.floats(-4, 4), st.sampled_from([1e300, -1e300]))


@st.composite
def records(draw: st.DrawFn) -> list[dict[str, Any]]:
    ids = draw(st.lists(IDS, unique=True, max_size=7))
    extra = st.dictionaries(st.sampled_from(FIELDS), RECORD_VALUES, max_size=4)
    return [{"id": i, "extra": draw(extra)} for i in ids]


@st.composite
def conditions(draw: st.DrawFn, field: str) -> object:
    scalars = IDS.filter(lambda s: "\x00" not in s) if field == "id" else FILTER_SCALARS
    kind = draw(st.sampled_from(["eq", "in"] if field == "id" else ["eq", "in", "range"]))
    if kind == "eq":
        return draw(scalars)
    if kind == "in":
        return {"in": draw(st.lists(scalars, min_size=1, max_size=4))}
    ops = draw(
        st.sampled_from([("gte",), ("gt",), ("lte",), ("lt",), ("gte", "lt"), ("gt", "lte")])
    )
    return {op: draw(BOUND) for op in ops}


@st.composite
def filters(draw: st.DrawFn) -> object:
    fields = draw(st.lists(st.sampled_from([*FIELDS, "missing"]), unique=True, max_size=3))
    return {f: draw(conditions(f)) for f in fields}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(items=records(), specs=st.lists(filters(), min_size=1, max_size=4))
def test_sql_agrees_with_python(items: list[dict[str, Any]], specs: list[object]) -> None:
    """matching_rows over metadata.sqlite equals matches() over the same records."""
    parsed = []
    for spec in specs:
        try:
            parsed.append(MetadataFilter.parse(spec))
        except FilterError:
            continue
    assume(parsed)
    with tempfile.TemporaryDirectory() as tmp:
        db = sqlite3.connect(write_metadata(Path(tmp) / "metadata.sqlite", items))
        for flt in parsed:
            expected = [flt.matches(r) for r in items]
            assert flt.matching_rows(db, len(items)).tolist() == expected, flt.describe()
        db.close()


@pytest.mark.parametrize(
    "spec",
    [
        {"year": {"gte": 2005, "lte": 2000}},
        {"year": {"gt": 2001, "lt": 2001}},
        {"split": "te\x00st"},
        {"split": "\ud800"},
        {"year": {"gte": 2**70}},
        {"n": 10**400},
        {"split": {"in": ["\x00", "\udfff"]}},
    ],
)
def test_what_json_schema_allows_is_accepted_and_matches_nothing(
    spec: dict, tmp_path: Path
) -> None:
    """Every filter the served schema calls valid is taken: empty ranges, strings no stored
    value can equal (NUL, an unpaired surrogate) and integers past 64 bits (read as SQLite
    reads them) match no item rather than being refused."""
    assert rows_matching(spec, PICTURES, tmp_path) == []


def test_an_unbounded_side_past_the_float_range_keeps_every_number(tmp_path: Path) -> None:
    assert rows_matching({"year": {"lte": 10**400}}, PICTURES, tmp_path) == ["p2", "u0"]


_NUMBERS = st.one_of(st.integers(), st.floats(allow_nan=False, allow_infinity=False))
_SCALARS = st.one_of(st.text(), _NUMBERS, st.booleans())
_LOWER = st.builds(lambda op, v: {op: v}, st.sampled_from(["gte", "gt"]), _NUMBERS)
_UPPER = st.builds(lambda op, v: {op: v}, st.sampled_from(["lte", "lt"]), _NUMBERS)
_RANGES = st.builds(
    lambda lo, hi: {**lo, **hi}, st.one_of(st.just({}), _LOWER), st.one_of(st.just({}), _UPPER)
).filter(bool)
_LISTS = st.builds(lambda v: {"in": v}, st.lists(_SCALARS, min_size=1, max_size=5))
_IDS = st.one_of(
    st.text(), st.builds(lambda v: {"in": v}, st.lists(st.text(), min_size=1, max_size=5))
)
_FILTERS = st.dictionaries(
    st.from_regex(r"\A[A-Za-z0-9_-]{1,64}\Z").filter(lambda name: name != "id"),
    st.one_of(_SCALARS, _LISTS, _RANGES),
    max_size=4,
).flatmap(lambda spec: st.one_of(st.just(spec), _IDS.map(lambda i: {**spec, "id": i})))


@settings(max_examples=300, deadline=None)
@given(spec=_FILTERS)
def test_every_filter_the_served_schema_calls_valid_is_parsed(spec: dict) -> None:
    """The OpenAPI schema's `filter` and MetadataFilter.parse agree: no schema-valid filter is
    refused (schemathesis holds the service to that); odd strings, huge numbers and empty
    ranges included."""
    jsonschema.validate(spec, FILTER_JSON_SCHEMA)
    MetadataFilter.parse(spec)


@pytest.mark.parametrize(
    "spec",
    [{"a b": 1}, {"a": {"gte": 1, "gt": 2}}, {"a": {"in": []}}, {"a": {}}, {"id": 3}, {"a": None}],
)
def test_filters_the_schema_refuses_are_refused_by_the_parser_too(spec: dict) -> None:
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(spec, FILTER_JSON_SCHEMA)
    with pytest.raises(FilterError):
        MetadataFilter.parse(spec)
