"""The long-lived services of a running app (built once by its lifespan, service.http.main)."""

from dataclasses import dataclass

from models.onnx.encoder_runtime import OnnxEncoder
from models.settings import Settings
from service.batching import MicroBatcher
from service.cache import ResultCache
from service.compactor import Compactor
from service.image_decode import ImageDecoder
from service.index_holder import IndexHolder
from service.metrics import ServiceMetrics
from service.outcome import SearchResponse
from service.redis_health import RedisHealth
from service.searcher import Query, Searcher


@dataclass
class Services:
    """Everything a request needs, built once by the app's lifespan."""

    settings: Settings
    metrics: ServiceMetrics
    holder: IndexHolder
    encoders: dict[str, OnnxEncoder]
    searcher: Searcher
    batcher: MicroBatcher[Query, SearchResponse]
    cache: ResultCache
    model_name: str
    decoder: ImageDecoder
    image_batcher: MicroBatcher[
        Query, SearchResponse
    ]  # image queries; text and embeddings: batcher
    compactor: Compactor
    redis_health: RedisHealth | None = None
    searches_in_flight: int = 0  # between cache lookup and result (service.http.search_flow)
