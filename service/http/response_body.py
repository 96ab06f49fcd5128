"""The JSON body of a search answer, written straight from its Outcome.

Its shape is service.http.schemas.SearchResponse, the model the OpenAPI schema shows; building
and validating those models cost about 42 us a response, a dict through pydantic_core 17 us
(a text answer of 10 results). The tests hold the two together: every body parses into
SearchResponse and dumps back to the same bytes.
"""

import dataclasses
from typing import Any

import pydantic_core

from service.outcome import Outcome

TIMINGS = ("encode", "shortlist", "rerank", "uncertainty", "total")


def response_body(outcome: Outcome, model_name: str, return_embedding: bool) -> bytes:
    """The SearchResponse of `outcome` as JSON (NaN and infinities as null, as pydantic)."""
    body = {
        "query": _query(outcome, return_embedding),
        "results": [vars(hit) for hit in outcome.hits],  # Hit's fields are SearchHit's
        "metric": outcome.metric,
        "index_version": outcome.index_version,
        "model": model_name,
        "timings_ms": {stage: float(outcome.timings_ms[stage]) for stage in TIMINGS},
    }
    return pydantic_core.to_json(body, inf_nan_mode="null")


def _query(outcome: Outcome, return_embedding: bool) -> dict[str, Any]:
    unc, reject = outcome.uncertainty, outcome.reject_score
    return {
        "modality": outcome.kind,
        "log_det": unc.log_det,
        "entropy": unc.entropy,
        "mutual_information": unc.mutual_information,
        "feature_uncertainty": unc.feature_uncertainty,
        "posterior_entropy": unc.posterior_entropy,
        "top_mahalanobis": unc.top_mahalanobis,
        "reject_score": dataclasses.asdict(reject),
        "rejected": reject.rejected,
        "reject_threshold": reject.threshold,
        "temperature": outcome.temperature,
        "mc_samples": outcome.mc_samples,
        "shortlist_size": outcome.shortlist_size,
        "mu": outcome.mu.tolist() if return_embedding else None,
        "logvar": outcome.logvar.tolist() if return_embedding else None,
    }
