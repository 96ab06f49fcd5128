"""A search below the HTTP edge: the query's seed, the result cache, the image decode on a miss,
the micro-batchers and the response body. Route handlers parse and call `answer`."""

import asyncio
import hashlib
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from PIL import Image, UnidentifiedImageError

from models.networks.preprocess import ImageTooLargeError, InvalidImageError
from service.cache import cache_key
from service.errors import UnsupportedMediaTypeError
from service.index_holder import LoadedIndex
from service.outcome import SearchResponse, response_json
from service.searcher import GALLERY_OF_KIND, Query, QueryInput, SearchParams
from service.services import Services


@dataclass(frozen=True)
class Answer:
    """A response body (JSON bytes) and whether it came from the result cache."""

    body: bytes
    cache_hit: bool


def _digest(value: Any) -> str:
    return hashlib.sha256(
        json.dumps(value, sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()


async def answer(services: Services, ask: QueryInput, start: float) -> Answer:
    """Pin the version, check the options against it (Searcher.params: limits, defaults and
    the metrics that version serves, once), then cache lookup, micro-batched search, response
    body, cache store (written behind)."""
    with _in_flight(services), services.holder.acquire(ask.gallery) as loaded:
        params = services.searcher.params(ask.gallery, loaded, **ask.options)
        # The MC draws depend on the query itself only (so k, the metric or a threshold
        # override never change them); the cache key covers the whole canonical request.
        query_part = {"kind": ask.kind, "model": services.model_name, "mc": params.mc_samples}
        query_part.update(ask.identity)
        seed = int(_digest(query_part)[:16], 16) >> 1  # 63 bits
        request_hash = _digest({**query_part, "gallery": ask.gallery, "params": params.identity()})
        key = cache_key(services.holder.namespace, loaded.cache_version, request_hash)
        found = await _cached_or_searched(services, ask, params, loaded, key, seed)
    if isinstance(found, bytes):
        return Answer(found, cache_hit=True)
    found.timings_ms.total = 1000 * (time.perf_counter() - start)
    body = response_json(found)
    _observe(services, found)
    services.cache.store(key, body)
    return Answer(body, cache_hit=False)


async def _cached_or_searched(
    services: Services,
    ask: QueryInput,
    params: SearchParams,
    loaded: LoadedIndex,
    key: str,
    seed: int,
) -> bytes | SearchResponse:
    """The body cached under `key` when the lookup pays (_lookup_pays) and finds one, else
    the answer of the query made with `seed` from the version `loaded`."""
    alone: bool | None = None  # not known yet
    if await _lookup_pays(services, key):
        cached = await services.cache.get(key)
        if cached is not None:
            return cached
    else:
        services.metrics.cache_skips.inc()
        alone = True
    query = await _query(services, ask, params, loaded, seed)
    if alone is None or query.decode_ms > 0:  # others may have arrived meanwhile
        alone = await _alone(services)
    batcher = services.image_batcher if ask.kind == "image" else services.batcher
    return await batcher.submit(query, alone=alone)


async def _query(
    services: Services, ask: QueryInput, params: SearchParams, loaded: LoadedIndex, seed: int
) -> Query:
    """The query of `ask`; an image is decoded in the decoder's pool first, and its decode time
    observed and counted in the query's encode timing."""
    if ask.image_bytes is None:
        return ask.query(params, seed, loaded)
    start = time.perf_counter()
    image = await decode_image(services, ask.image_bytes)
    decode_ms = 1000 * (time.perf_counter() - start)
    services.metrics.observe_stage("decode", decode_ms)
    return ask.query(params, seed, loaded, image, decode_ms)


async def decode_image(services: Services, data: bytes) -> Image.Image:
    """Decode in the decoder's pool; a file of no image format at all is a 415, not a 422."""
    try:
        return await services.decoder.decode(data)
    except ImageTooLargeError as error:
        raise ImageTooLargeError(
            f"{error}; this service accepts images of at most {services.decoder.max_pixels} "
            "pixels: downscale it"
        ) from None
    except InvalidImageError as error:
        if isinstance(error.__cause__, UnidentifiedImageError):
            raise UnsupportedMediaTypeError(
                "the uploaded file is not in an image format this service reads; send a PNG, "
                "JPEG, GIF, BMP or WebP file"
            ) from None
        raise


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


def _observe(services: Services, response: SearchResponse) -> None:
    for stage, ms in vars(response.timings_ms).items():
        services.metrics.observe_stage(stage, ms)
    if response.query.rejected:
        gallery = GALLERY_OF_KIND.get(response.query.modality, "")
        services.metrics.rejections.labels(gallery=gallery).inc()
