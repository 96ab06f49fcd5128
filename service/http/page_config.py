"""What the search page needs to know about the running service: its defaults and limits, the
metrics it serves, and per gallery the active version and the range of item log-dets."""

from pydantic import BaseModel, Field

from service.gallery_stats import GalleryStats
from service.http.schemas import SearchOptions
from service.searcher import GALLERY_OF_KIND
from service.services import Services


class GallerySummary(BaseModel):
    """The active version of one gallery."""

    version: str
    count: int
    metrics: list[str] = Field(
        description="Metrics a search of this gallery accepts: those the version is indexed "
        "for and, once it has any calibration, has calibrated (max_pair on a pvse version)."
    )
    log_det_low: float = Field(description="Smallest item log-det (the most certain item).")
    log_det_high: float = Field(description="Largest item log-det (the least certain item).")
    log_det_rows: int = Field(description="Rows the range was read from (all, up to 100k).")


class ServiceConfig(BaseModel):
    """GET /v1/config: defaults and limits of the search API and the galleries it serves."""

    model: str
    default_k: int
    max_k: int
    default_metric: str = Field(description="Metric of a caption query that names none.")
    default_metrics: dict[str, str] = Field(
        description="Metric each gallery is ranked with when a query names none: image "
        "(caption queries), text (image queries)."
    )
    metrics: list[str] = Field(
        description="Metrics a search request may name: those every loaded gallery accepts "
        "(galleries.*.metrics). The page offers these; any other is refused with a 422 that "
        "lists them."
    )
    mc_samples: int
    max_text_chars: int
    max_image_bytes: int
    galleries: dict[str, GallerySummary] = Field(description="Loaded galleries: image, text.")


def service_config(services: Services, stats: GalleryStats) -> ServiceConfig:
    """Build the config; reads the galleries' log-dets on first use, so call it in a thread."""
    settings = services.settings
    galleries = {}
    for modality, version in services.holder.versions().items():
        if version is None:
            continue
        with services.holder.acquire(modality) as loaded:
            span = stats.log_det_range(modality, loaded.version, loaded.index)
            manifest = loaded.index.manifest
            galleries[modality] = GallerySummary(
                version=loaded.version,
                count=manifest.count,
                metrics=services.searcher.available_metrics(loaded),
                log_det_low=span.low,
                log_det_high=span.high,
                log_det_rows=span.rows,
            )
    defaults = services.searcher.default_metrics
    summaries = list(galleries.values())
    served = [
        m for m in (summaries[0].metrics if summaries else [])
        if all(m in g.metrics for g in summaries)
    ]  # fmt: skip
    return ServiceConfig(
        model=services.model_name,
        default_k=SearchOptions.model_fields["k"].default,
        max_k=settings.max_k,
        default_metric=defaults[GALLERY_OF_KIND["text"]],
        default_metrics=defaults,
        metrics=served,
        mc_samples=settings.mc_samples,
        max_text_chars=settings.max_text_chars,
        max_image_bytes=settings.max_image_bytes,
        galleries=galleries,
    )
