"""One truth for the active version (issue 41): every activation raises a generation, readers
take the higher of the ACTIVE file and Redis and repair the lower, so neither a Redis restored
from an old snapshot, nor a flushed one, nor an old pointer file sends a reader back; and two
index roots that share one Redis never see each other's versions (issue 43's namespaces)."""

import json

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from indexer.active_record import SET_IF_NEWER, ActiveRecord, newest, parse_record
from indexer.registry import ActiveRegistry, active_key, namespace_of
from tests.indexer.synthetic import publish_synthetic

VERSIONS = ("v1", "v2", "v3")


@pytest.fixture
def three_versions(tmp_path, redis_url) -> ActiveRegistry:
    registry = ActiveRegistry(tmp_path, redis_url)
    for seed, version in enumerate(VERSIONS):
        publish_synthetic(registry, "image", version, n=20, seed=seed)
    return registry


def test_records_round_trip_and_bare_names_are_generation_zero() -> None:
    assert parse_record(ActiveRecord("v7", 12).to_text()) == ActiveRecord("v7", 12)
    bare = "20240101T000000000Z-aaaa"
    assert parse_record(f"{bare}\n".encode()) == ActiveRecord(bare, 0)
    assert parse_record("") is None and parse_record(None) is None
    with pytest.raises(ValueError, match="unreadable active-version record"):
        parse_record('{"version": "v1"}')


@given(st.lists(st.one_of(st.none(), st.builds(ActiveRecord, st.sampled_from(VERSIONS),
                                                st.integers(0, 50))), max_size=5))  # fmt: skip
def test_newest_is_the_highest_generation_first_on_ties(records) -> None:
    present = [r for r in records if r is not None]
    best = newest(*records)
    if not present:
        assert best is None
        return
    top = max(r.generation for r in present)
    assert best == next(r for r in present if r.generation == top)


def test_redis_only_takes_a_newer_generation(redis_url) -> None:
    client = redis.Redis.from_url(redis_url)
    client.set("k", "a-bare-version-name")  # written by an older probsearch: generation 0
    assert client.eval(SET_IF_NEWER, 1, "k", ActiveRecord("v1", 0).to_text(), 0) == 0
    assert client.eval(SET_IF_NEWER, 1, "k", ActiveRecord("v1", 1).to_text(), 1) == 1
    assert client.eval(SET_IF_NEWER, 1, "k", ActiveRecord("v2", 1).to_text(), 1) == 0
    assert parse_record(client.get("k")) == ActiveRecord("v1", 1)
    client.set("k", "12345")  # a bare name that JSON reads as a number is still generation 0
    assert client.eval(SET_IF_NEWER, 1, "k", ActiveRecord("v3", 1).to_text(), 1) == 1


# One step: activate a version, restore Redis to what it held 1-4 steps earlier (a snapshot
# or a lagging replica), flush Redis, or put back the ACTIVE file of 1-4 steps earlier.
STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("activate"), st.sampled_from(VERSIONS)),
        st.tuples(st.just("restore_redis"), st.integers(1, 4)),
        st.tuples(st.just("flush_redis"), st.none()),
        st.tuples(st.just("restore_file"), st.integers(1, 4)),
    ),
    min_size=1,
    max_size=12,
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(steps=STEPS)
def test_readers_never_go_back_to_an_older_activation(three_versions, steps) -> None:
    registry = three_versions
    client = redis.Redis.from_url(registry.redis_url)
    key = active_key(registry.namespace, "image")
    pointer = registry.index_root / "image" / "ACTIVE"
    client.delete(key)
    pointer.unlink(missing_ok=True)
    redis_history, file_history = [client.get(key)], [None]
    activated: list[str] = []
    for action, arg in steps:
        if action == "activate":
            registry.activate("image", arg)
            activated.append(arg)
        elif action == "restore_redis":
            old = redis_history[max(len(redis_history) - arg, 0)]
            client.delete(key) if old is None else client.set(key, old)
        elif action == "flush_redis":
            client.delete(key)
        else:
            old = file_history[max(len(file_history) - arg, 0)]
            pointer.unlink(missing_ok=True) if old is None else pointer.write_text(old)
        reader = ActiveRegistry(registry.index_root, registry.redis_url)
        record = reader.active_record("image")
        if activated:
            assert record == ActiveRecord(activated[-1], len(activated))
            # the reader repaired both stores: the next reader of either alone agrees
            assert parse_record(client.get(key)) == record
            assert parse_record(pointer.read_text()) == record
        else:
            assert record is None
        redis_history.append(client.get(key))
        file_history.append(pointer.read_text() if pointer.exists() else None)


def test_two_index_roots_on_one_redis_keep_their_own_versions(tmp_path, redis_url) -> None:
    staging = ActiveRegistry(tmp_path / "staging", redis_url)
    live = ActiveRegistry(tmp_path / "live", redis_url)
    assert staging.namespace != live.namespace
    assert staging.namespace == namespace_of(tmp_path / "staging" / ".." / "staging")
    publish_synthetic(staging, "text", "s1")
    publish_synthetic(live, "text", "l1", seed=1)
    staging.activate("text", "s1")
    live.activate("text", "l1")
    live.activate("text", "l1")
    assert staging.active_record("text") == ActiveRecord("s1", 1)
    assert live.active_record("text") == ActiveRecord("l1", 2)
    client = redis.Redis.from_url(redis_url)
    assert json.loads(client.get(active_key(staging.namespace, "text")))["version"] == "s1"
    # an explicit namespace is shared by whoever names it
    named = ActiveRegistry(tmp_path / "staging", redis_url, namespace="shop")
    assert named.active_record("text") == ActiveRecord("s1", 1)  # from the file, then repaired
    assert json.loads(client.get(active_key("shop", "text")))["version"] == "s1"
