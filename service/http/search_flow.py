"""A search below the HTTP edge: limits and defaults of the options, the query's seed, the
result cache and the micro-batchers (the body: service.http.response_body). Route handlers parse
and answer."""

import asyncio
import hashlib
import json
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from models.settings import Settings
from service.batching import MicroBatcher
from service.cache import cache_key
from service.errors import IndexUnavailableError, InvalidQueryError
from service.http.response_body import response_body
from service.http.schemas import SearchOptions
from service.outcome import Outcome
from service.searcher import GALLERY_OF_KIND, Query, SearchParams, default_shortlist
from service.services import Services


@dataclass(frozen=True)
class Answer:
    """A response body (JSON bytes) and whether it came from the result cache."""

    body: bytes
    cache_hit: bool


def check_text(text: str, settings: Settings) -> None:
    """A caption query must have a word and fit max_text_chars."""
    if not text.strip():
        raise InvalidQueryError("text is empty: send a caption with at least one word")
    if len(text) > settings.max_text_chars:
        raise InvalidQueryError(
            f"text has {len(text)} characters; the limit is {settings.max_text_chars} "
            "(max_text_chars)"
        )


def search_params(options: SearchOptions, services: Services, gallery: str) -> SearchParams:
    """Check the options against the configured limits and fill in the defaults (the metric:
    the one `gallery` is ranked with by default)."""
    settings = services.settings
    if options.k > settings.max_k:
        raise InvalidQueryError(f"k={options.k} is above the limit {settings.max_k}; ask for fewer")
    if options.shortlist is not None:
        if options.shortlist > settings.max_shortlist:
            raise InvalidQueryError(
                f"shortlist={options.shortlist} is above the limit {settings.max_shortlist}"
            )
        if options.shortlist < options.k:
            raise InvalidQueryError(
                f"shortlist={options.shortlist} is smaller than k={options.k}; it must be >= k"
            )
    mc_samples = settings.mc_samples if options.mc_samples is None else options.mc_samples
    if mc_samples > settings.max_mc_samples:
        raise InvalidQueryError(
            f"mc_samples={mc_samples} is above the limit {settings.max_mc_samples}"
        )
    return SearchParams(
        k=options.k,
        metric=options.metric or services.searcher.default_metric(gallery),
        shortlist=options.shortlist or min(default_shortlist(options.k), settings.max_shortlist),
        mc_samples=mc_samples,
        temperature=options.temperature,
        reject_threshold=options.reject_threshold,
        return_embedding=options.return_embedding,
    )


def _digest(value: Any) -> str:
    return hashlib.sha256(
        json.dumps(value, sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()


async def answer(
    services: Services,
    kind: str,
    gallery: str,
    params: SearchParams,
    payload: dict[str, Any],
    make_query: Callable[[int], Awaitable[Query]],
    start: float,
) -> Answer:
    """Cache lookup, micro-batched search, response body, cache store (written behind).

    `make_query` builds the query from its seed on a cache miss only, so that a hit skips
    the work it may hold (decoding an image)."""
    with _in_flight(services):
        version = services.holder.versions().get(gallery)
        if version is None:
            raise IndexUnavailableError(services.holder.unavailable_message(gallery))
        # The MC draws depend on the query itself only (so k, the metric or a threshold
        # override never change them); the cache key covers the whole canonical request.
        query_part = {"kind": kind, "model": services.model_name, "mc": params.mc_samples}
        query_part.update(payload)
        seed = int(_digest(query_part)[:16], 16) >> 1  # 63 bits
        request_hash = _digest({**query_part, "gallery": gallery, "params": vars(params)})
        batcher = services.image_batcher if kind == "image" else services.batcher
        found = await _cached_or_searched(
            services, batcher, cache_key(version, request_hash), make_query, seed
        )
    if isinstance(found, bytes):
        return Answer(found, cache_hit=True)
    outcome = found
    outcome.timings_ms["total"] = 1000 * (time.perf_counter() - start)
    body = response_body(outcome, services.model_name, params.return_embedding)
    _observe(services, outcome)
    services.cache.store(cache_key(outcome.index_version, request_hash), body)
    return Answer(body, cache_hit=False)


async def _cached_or_searched(
    services: Services,
    batcher: MicroBatcher[Query, Outcome],
    key: str,
    make_query: Callable[[int], Awaitable[Query]],
    seed: int,
) -> bytes | Outcome:
    """The body cached under `key` when the lookup pays (_lookup_pays) and finds one, else
    the outcome of the query made with `seed`."""
    alone: bool | None = None  # not known yet
    if await _lookup_pays(services, key):
        cached = await services.cache.get(key)
        if cached is not None:
            return cached
    else:
        services.metrics.cache_skips.inc()
        alone = True
    query = await make_query(seed)
    if alone is None or query.decode_ms > 0:  # others may have arrived meanwhile
        alone = await _alone(services)
    return await batcher.submit(query, alone=alone)


async def _lookup_pays(services: Services, key: str) -> bool:
    """Whether to ask the result cache before searching.

    Under load, always: a hit saves CPU that other requests wait for. A lone search (nothing
    else under way) asks only for a key this process stored or found lately (ResultCache.known):
    at one client on 2 cores a lookup that misses costs about 0.1 ms of a 2.4 ms text search
    (text p50 2.42 ms asking, 2.28-2.30 ms not, two quick runs of benchmarks/service_bench.py
    each, median of 3 rounds), which only a hit pays back, and distinct requests mostly
    miss; a repeat that another process cached then costs its search on an idle CPU."""
    if not services.cache.enabled or services.cache.known(key):
        return True
    return not await _alone(services)


@contextmanager
def _in_flight(services: Services) -> Iterator[None]:
    """Counts the searches between cache lookup and result (Services.searches_in_flight)."""
    services.searches_in_flight += 1
    try:
        yield
    finally:
        services.searches_in_flight -= 1


async def _alone(services: Services) -> bool:
    """Whether no other search is under way, so that this one may skip the batcher's worker
    thread (service.batching). Requests already received but not yet counted (the loop was
    busy) get one turn of the loop to reach answer() and count themselves first; otherwise,
    with no await on their way (no cache), every request of a burst would find itself alone
    and run on the loop one after another."""
    if services.searches_in_flight > 1:
        return False
    await asyncio.sleep(0)
    return services.searches_in_flight == 1


def _observe(services: Services, outcome: Outcome) -> None:
    for stage, ms in outcome.timings_ms.items():
        services.metrics.observe_stage(stage, ms)
    if outcome.reject_score.rejected:
        services.metrics.rejections.labels(gallery=GALLERY_OF_KIND.get(outcome.kind, "")).inc()
