"""Components of the service on their own: micro-batching, cache fail-open, settings, CLI."""

import asyncio
import subprocess
import threading
import time
from types import SimpleNamespace

import pytest

from models.settings import Settings
from service import cache as cache_module
from service.batching import MicroBatcher
from service.cache import Backoff, ResultCache, cache_key
from service.errors import (
    IndexUnavailableError,
    InvalidQueryError,
    OverloadedError,
    status_of,
)
from service.http import search_flow
from service.metrics import STAGES, ServiceMetrics
from tests.service.conftest import PROBSEARCH


def test_batcher_gathers_concurrent_items_off_the_event_loop() -> None:
    batches: list[list[int]] = []
    loop_thread = threading.get_ident()

    def process(items):
        assert threading.get_ident() != loop_thread  # never on the event loop
        batches.append(list(items))
        return [ValueError("odd") if item % 2 else item * 10 for item in items]

    async def scenario():
        batcher = MicroBatcher(process, max_size=4, max_wait_s=0.05)
        await batcher.start()
        try:
            return await asyncio.gather(*(batcher.submit(i) for i in range(10)),
                                        return_exceptions=True)  # fmt: skip
        finally:
            await batcher.stop()

    results = asyncio.run(scenario())
    assert [r for r in results if not isinstance(r, Exception)] == [0, 20, 40, 60, 80]
    assert all(isinstance(results[i], ValueError) for i in range(1, 10, 2))
    assert max(map(len, batches)) == 4 and sum(map(len, batches)) == 10
    assert len(batches) < 10  # concurrent items were really batched


@pytest.mark.parametrize("concurrency", [1, 2])
def test_batcher_runs_up_to_concurrency_batches_at_once(concurrency: int) -> None:
    """Each batch waits at a two-party barrier: only two batches in flight at once pass it,
    one batch at a time times out there (the item's error)."""
    barrier = threading.Barrier(2, timeout=2.0)
    threads: set[int] = set()

    def process(items):
        threads.add(threading.get_ident())
        try:
            barrier.wait()
        except threading.BrokenBarrierError as error:
            return [error] * len(items)
        return list(items)

    async def scenario():
        batcher = MicroBatcher(process, max_size=1, max_wait_s=0, concurrency=concurrency)
        await batcher.start()
        try:
            return await asyncio.gather(*(batcher.submit(i) for i in range(2)),
                                        return_exceptions=True)  # fmt: skip
        finally:
            await batcher.stop()

    results = asyncio.run(scenario())
    if concurrency == 2:
        assert results == [0, 1] and len(threads) == 2
    else:
        assert isinstance(results[0], threading.BrokenBarrierError) and len(threads) == 1


def test_batcher_refuses_no_concurrency() -> None:
    with pytest.raises(ValueError, match="concurrency"):
        MicroBatcher(lambda items: list(items), max_size=1, max_wait_s=0, concurrency=0)


def test_batcher_closes_a_batch_after_the_wait() -> None:
    async def scenario():
        batcher = MicroBatcher(lambda items: list(items), max_size=100, max_wait_s=0.02)
        await batcher.start()
        start = time.perf_counter()
        result = await batcher.submit(7)
        elapsed = time.perf_counter() - start
        await batcher.stop()
        return result, elapsed

    result, elapsed = asyncio.run(scenario())
    assert result == 7 and elapsed < 1.0


def test_batcher_holds_no_lone_request_but_waits_under_load() -> None:
    """A lone request is dispatched at once even with a long window; after a batch of more
    than one (load), the next batch waits for company up to the window."""
    batches: list[list[int]] = []

    def process(items):
        batches.append(list(items))
        return list(items)

    async def scenario():
        batcher = MicroBatcher(process, max_size=2, max_wait_s=30.0)
        await batcher.start()
        try:
            lone = await asyncio.wait_for(batcher.submit(0), timeout=10)
            pair = await asyncio.gather(batcher.submit(1), batcher.submit(2))  # queued together
            late = asyncio.create_task(batcher.submit(3))
            await asyncio.sleep(0.2)  # under load now: 3 waits in its batch for 4
            await asyncio.wait_for(asyncio.gather(late, batcher.submit(4)), timeout=10)
            return lone, pair
        finally:
            await batcher.stop()

    assert asyncio.run(scenario()) == (0, [1, 2])
    assert batches == [[0], [1, 2], [3, 4]]


def test_batcher_without_a_window_batches_what_arrived_while_the_last_batch_ran() -> None:
    """max_wait_s=0 (the service's default): the items submitted while a batch runs form the
    next batch together, and after that batch of several a lone item is not held back."""
    release = threading.Event()
    batches: list[list[int]] = []

    def process(items):
        batches.append(list(items))
        if items == [0]:
            release.wait(5)
        return list(items)

    async def scenario():
        batcher = MicroBatcher(process, max_size=8, max_wait_s=0)
        await batcher.start()
        try:
            first = asyncio.create_task(batcher.submit(0))
            await asyncio.sleep(0.05)  # item 0 holds the worker
            queued = [asyncio.create_task(batcher.submit(i)) for i in (1, 2, 3)]
            await asyncio.sleep(0.05)
            release.set()
            await asyncio.wait_for(asyncio.gather(first, *queued), timeout=10)
            return await asyncio.wait_for(batcher.submit(4), timeout=1)
        finally:
            await batcher.stop()

    assert asyncio.run(scenario()) == 4
    assert batches == [[0], [1, 2, 3], [4]]


def test_batcher_runs_its_thread_initializer_in_the_worker_thread() -> None:
    seen: list[int] = []

    async def scenario():
        batcher = MicroBatcher(
            lambda items: [threading.get_ident() for _ in items],
            max_size=1,
            max_wait_s=0,
            thread_initializer=lambda: seen.append(threading.get_ident()),
        )
        await batcher.start()
        try:
            return await batcher.submit(0)
        finally:
            await batcher.stop()

    assert [asyncio.run(scenario())] == seen


def test_batcher_runs_a_lone_item_on_the_loop_and_anything_else_in_its_worker() -> None:
    """inline_when_alone: an item submitted alone while the batcher is idle runs on the event
    loop's thread (the thread initializer ran there too), its error raised as is; an item not
    alone, or one submitted while a batch is running, goes to the worker."""
    release = threading.Event()
    initialized: list[int] = []

    def process(items):
        if items == [-1]:
            raise ValueError("bad item")
        if 0 in items:
            release.wait(5)
        return [threading.get_ident() for _ in items]

    async def scenario():
        batcher = MicroBatcher(
            process, max_size=4, max_wait_s=0, inline_when_alone=True,
            thread_initializer=lambda: initialized.append(threading.get_ident()),
        )  # fmt: skip
        await batcher.start()
        try:
            alone = await batcher.submit(1, alone=True)
            with pytest.raises(ValueError, match="bad item"):
                await batcher.submit(-1, alone=True)
            not_alone = await batcher.submit(2)
            running = asyncio.create_task(batcher.submit(0))
            await asyncio.sleep(0.05)  # item 0 holds the worker
            behind = asyncio.create_task(batcher.submit(3, alone=True))
            await asyncio.sleep(0.05)
            assert not behind.done()  # it waits for the worker instead of running inline
            release.set()
            return alone, not_alone, await running, await behind
        finally:
            await batcher.stop()

    loop_thread = threading.get_ident()  # asyncio.run runs its loop on this thread
    alone, not_alone, running, behind = asyncio.run(scenario())
    assert alone == loop_thread and initialized[0] == loop_thread
    assert not_alone != loop_thread and running == not_alone and behind == not_alone


def test_batcher_refuses_work_beyond_its_queue() -> None:
    release = threading.Event()

    def slow(items):
        release.wait(5)
        return list(items)

    async def scenario():
        batcher = MicroBatcher(slow, max_size=1, max_wait_s=0, max_queue=2)
        await batcher.start()
        first = asyncio.create_task(batcher.submit(0))
        await asyncio.sleep(0.05)  # the first item is being processed, the queue is empty
        queued = [asyncio.create_task(batcher.submit(i)) for i in (1, 2)]
        await asyncio.sleep(0.01)
        with pytest.raises(OverloadedError, match="too many queued searches"):
            await batcher.submit(3)
        release.set()
        results = await asyncio.gather(first, *queued)
        await batcher.stop()
        return results

    assert asyncio.run(scenario()) == [0, 1, 2]


def test_backoff_doubles_up_to_its_maximum_and_resets() -> None:
    now = [0.0]
    backoff = Backoff(initial_s=0.5, maximum_s=3.0, clock=lambda: now[0])
    assert backoff.ready() and not backoff.down
    assert [backoff.failed() for _ in range(5)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert not backoff.ready()
    now[0] = 3.0
    assert backoff.ready() and backoff.down
    backoff.succeeded()
    assert not backoff.down and backoff.failed() == 0.5


def test_cache_round_trip_and_fail_open(redis_url: str) -> None:
    async def scenario():
        metrics = ServiceMetrics()
        cache = ResultCache(redis_url, ttl_s=60, metrics=metrics)
        key = cache_key("ns", "v1", "abc")
        assert key == "probsearch:ns:cache:v1:abc"
        assert await cache.get(key) is None
        await cache.set(key, b"{}")
        assert await cache.get(key) == b"{}"
        await cache.close()
        # Nothing listens on port 1: every call is a miss, never an error.
        down = ResultCache("redis://127.0.0.1:1/0", ttl_s=60, metrics=metrics)
        started = time.perf_counter()
        assert await down.get(key) is None
        await down.set(key, b"{}")
        assert await down.get(key) is None  # within the backoff: Redis is not even tried
        await down.close()
        return metrics, time.perf_counter() - started

    metrics, elapsed = asyncio.run(scenario())
    assert elapsed < 2.0
    assert metrics.registry.get_sample_value("probsearch_cache_hits_total") == 1
    assert metrics.registry.get_sample_value("probsearch_redis_up") == 0
    errors = metrics.registry.get_sample_value(
        "probsearch_redis_errors_total", {"component": "cache"}
    )
    assert errors == 1


def test_cache_store_writes_behind_and_reads_its_own_writes(redis_url: str) -> None:
    """store() returns before Redis has the body, get() finds it meanwhile, and the write
    lands in Redis (read back by a client of its own); close() waits for writes under way."""
    import redis

    async def scenario() -> tuple[bytes | None, bytes | None]:
        cache = ResultCache(redis_url, ttl_s=60, metrics=ServiceMetrics())
        key = cache_key("ns", "v-behind", "request")
        cache.store(key, b'{"a": 1}')
        in_flight = await cache.get(key)  # the write has not reached Redis yet
        await cache.close()
        return in_flight, redis.Redis.from_url(redis_url).get(key)

    in_flight, stored = asyncio.run(scenario())
    assert in_flight == b'{"a": 1}'
    assert stored == b'{"a": 1}'


def test_cache_writes_the_bodies_stored_within_the_delay_in_one_pipeline(redis_url: str) -> None:
    import redis

    reader = redis.Redis.from_url(redis_url)
    keys = [cache_key("ns", "v-together", str(i)) for i in range(4)]

    async def scenario() -> tuple[list, list, list]:
        cache = ResultCache(redis_url, ttl_s=60, metrics=ServiceMetrics(), write_delay_s=0.05)
        batches: list[list[str]] = []
        set_many = cache.set_many

        async def recorded(items: list[tuple[str, bytes]]) -> None:
            batches.append([key for key, _ in items])
            await set_many(items)

        cache.set_many = recorded  # type: ignore[method-assign]
        for i, key in enumerate(keys[:3]):
            cache.store(key, str(i).encode())
        before = reader.mget(keys[:3])  # the writer is still waiting for more
        await asyncio.sleep(0.2)
        after = reader.mget(keys[:3])
        cache.store(keys[3], b"3")
        await cache.close()  # writes what is queued at once
        return before, after, batches

    before, after, batches = asyncio.run(scenario())
    assert before == [None, None, None]
    assert after == [b"0", b"1", b"2"]
    assert batches == [keys[:3], keys[3:]]
    assert reader.get(keys[3]) == b"3" and 0 < reader.ttl(keys[3]) <= 60


def test_cache_knows_the_keys_it_stored_or_found_lately(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """known(): keys this process stored or found in Redis, the last KNOWN_KEYS of them; a key
    only another client wrote, or one that missed, is not known."""
    import redis

    monkeypatch.setattr(cache_module, "KNOWN_KEYS", 3)
    keys = [cache_key("ns", "v-known", str(i)) for i in range(5)]
    redis.Redis.from_url(redis_url).set(keys[4], b"elsewhere")

    async def scenario() -> tuple[list[bool], list[bool]]:
        cache = ResultCache(redis_url, ttl_s=60, metrics=ServiceMetrics())
        unknown = [cache.known(key) for key in keys]
        cache.store(keys[0], b"0")
        cache.store(keys[1], b"1")
        assert await cache.get(keys[2]) is None  # a miss teaches nothing
        assert await cache.get(keys[4]) == b"elsewhere"
        cache.store(keys[3], b"3")  # the fourth known key: keys[0] is forgotten
        known = [cache.known(key) for key in keys]
        await cache.close()
        return unknown, known

    unknown, known = asyncio.run(scenario())
    assert unknown == [False] * 5
    assert known == [False, True, False, True, True]


@pytest.mark.parametrize(
    ("cache_on", "stored", "in_flight", "asks"),
    [
        (True, False, 1, False),  # lone, a key it never saw: skip the lookup
        (True, True, 1, True),  # lone, a key it stored: ask
        (True, False, 2, True),  # under load: always ask
        (False, False, 1, True),  # no cache: get() answers at once, nothing to skip
    ],
)
def test_a_lone_search_asks_the_cache_only_for_keys_it_knows(
    redis_url: str, cache_on: bool, stored: bool, in_flight: int, asks: bool
) -> None:
    async def scenario() -> bool:
        cache = ResultCache(redis_url if cache_on else None, ttl_s=60, metrics=ServiceMetrics())
        key = cache_key("ns", "v-pays", "request")
        if stored:
            cache.store(key, b"{}")
        services = SimpleNamespace(cache=cache, searches_in_flight=in_flight)
        pays = await search_flow._lookup_pays(services, key)  # type: ignore[arg-type]
        await cache.close()
        return pays

    assert asyncio.run(scenario()) is asks


def test_cache_store_fails_open_when_redis_is_down() -> None:
    async def scenario() -> bytes | None:
        cache = ResultCache("redis://127.0.0.1:1/0", ttl_s=60, metrics=ServiceMetrics())
        key = cache_key("ns", "v1", "down")
        cache.store(key, b"{}")
        await cache.close()  # the failed write is finished and forgotten
        return await cache.get(key)

    assert asyncio.run(scenario()) is None


def test_settings_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROBSEARCH_API_KEYS", "first-key-0123456789, second-key-0123456789")
    monkeypatch.setenv("PROBSEARCH_GALLERIES", "text")
    monkeypatch.setenv("PROBSEARCH_MAX_K", "50")
    settings = Settings()
    assert [k.get_secret_value() for k in settings.api_keys] == [
        "first-key-0123456789", "second-key-0123456789"
    ]  # fmt: skip
    assert settings.galleries == ["text"] and settings.max_k == 50
    assert "first-key" not in repr(settings)  # secrets stay out of logs
    assert settings.redis_url is None and settings.cors_origins == []


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"require_api_key_for_search": True}, "no api_keys are configured"),
        ({"api_keys": "short"}, "at least 16 characters"),
        ({"mc_samples": 100, "max_mc_samples": 10}, "exceeds max_mc_samples"),
        ({"candidate_metric": "elk"}, "candidate_metric must have an index form"),
    ],
)
def test_unsafe_settings_are_refused(values: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Settings(**values)


def test_status_table() -> None:
    assert status_of(InvalidQueryError("x")) == (422, "invalid_query")
    assert status_of(IndexUnavailableError("x")) == (503, "index_unavailable")
    assert status_of(RuntimeError("x")) == (500, "internal_error")


@pytest.mark.parametrize(
    "command", [["serve"], ["calibrate", "--data", ".", "--target-coverage", "0.8"]]
)
def test_commands_reading_a_model_refuse_a_missing_model_dir_with_one_line(
    tmp_path, command: list[str]
) -> None:
    argv = [str(PROBSEARCH), *command, "--model", str(tmp_path / "nope"),
            "--index-root", str(tmp_path)]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "has no model.json: pass --model MODEL_DIR" in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "command", [["serve"], ["calibrate", "--data", ".", "--target-coverage", "0.8"]]
)
def test_commands_reading_an_index_root_refuse_a_missing_one_with_one_line(
    tmp_path, command: list[str]
) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "model.json").write_text("{}")
    argv = [str(PROBSEARCH), *command, "--model", str(model),
            "--index-root", str(tmp_path / "absent")]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "does not exist: pass --index-root" in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("stage", [*STAGES, "a stage not listed"])
def test_a_stage_observation_lands_in_its_own_histogram(stage: str) -> None:
    metrics = ServiceMetrics()
    metrics.observe_stage(stage, 2.0)
    metrics.observe_stage(stage, 6.0)
    labels = {"stage": stage}
    sample = metrics.registry.get_sample_value
    assert sample("probsearch_stage_latency_seconds_count", labels) == 2
    assert sample("probsearch_stage_latency_seconds_sum", labels) == pytest.approx(0.008)
    others = [s for s in STAGES if s != stage]
    assert all(sample("probsearch_stage_latency_seconds_count", {"stage": s}) == 0 for s in others)
