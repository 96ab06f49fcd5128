"""A search's answer: its results, uncertainty and rejection decision, taken from the batched
re-rank (models.scoring.rerank) and scores (models.scoring.query_scores) of its group."""

from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from indexer.manifest import Calibration
from models.scoring.query_scores import QueryScores, unfamiliar
from models.scoring.rerank import RankedBatch
from models.scoring.uncertainty import log_det

QueryKind = Literal["text", "image", "embedding"]
DEFAULT_TEMPERATURE = 1.0
DEFAULT_REJECT_SCORE = "mutual_information"  # of a version that was never calibrated


@dataclass
class Hit:
    """One result: the fields of the response's SearchHit, in its order (service.http.response_body
    writes a Hit as it is)."""

    id: str
    rank: int
    score: float
    distance: float
    log_det: float
    metadata: dict[str, Any]


@dataclass
class Uncertainty:
    """The query's scores (models.scoring.query_scores) as numbers; None where not computed."""

    log_det: float
    entropy: float
    mutual_information: float | None
    feature_uncertainty: float | None
    posterior_entropy: float
    top_mahalanobis: float | None

    @classmethod
    def at(cls, scores: QueryScores, j: int) -> "Uncertainty":
        """The scores of the query at position j."""
        return cls(**{name: _value(scores.get(name), j) for name in cls.__dataclass_fields__})


def _value(values: np.ndarray | None, j: int) -> float | None:
    return None if values is None else float(values[j])


@dataclass
class RejectScore:
    """The score the service rejects with (chosen by calibration), its value and threshold."""

    name: str
    value: float | None
    threshold: float | None

    @property
    def rejected(self) -> bool:
        return self.value is not None and self.threshold is not None and self.value > self.threshold


@dataclass
class Outcome:
    """Everything a search endpoint answers."""

    kind: QueryKind
    metric: str
    index_version: str
    temperature: float
    reject_score: RejectScore
    mc_samples: int
    shortlist_size: int
    uncertainty: Uncertainty
    hits: list[Hit]
    mu: np.ndarray
    logvar: np.ndarray
    timings_ms: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class ScoreSettings:
    """A query's temperature and rejection rule: its request's, else its metric's calibration."""

    temperature: float
    threshold: float | None
    score_name: str
    log_det_limit: float | None = None  # the calibration's familiarity gate

    @classmethod
    def of(
        cls, calibration: Calibration | None, temperature: float | None, threshold: float | None
    ) -> "ScoreSettings":
        """The request's temperature and threshold (None: not set) over the calibration's. A
        request's threshold replaces the whole calibrated rule, the familiarity gate too."""
        if calibration is None:
            return cls(float(temperature or DEFAULT_TEMPERATURE), threshold, DEFAULT_REJECT_SCORE)
        return cls(
            float(temperature or calibration.temperature),
            calibration.threshold if threshold is None else threshold,
            calibration.score,
            calibration.log_det_limit if threshold is None else None,
        )

    def reject_score(self, uncertainty: "Uncertainty") -> "RejectScore":
        """The score that decides: the query's log-det against the familiarity gate when it
        is above it (an image unlike the training images), else the calibrated score."""
        if unfamiliar(uncertainty.log_det, self.log_det_limit):
            return RejectScore("log_det", uncertainty.log_det, self.log_det_limit)
        return RejectScore(
            self.score_name, getattr(uncertainty, self.score_name, None), self.threshold
        )


def hit_lists(
    index: Any, ranked: RankedBatch, posteriors: list[np.ndarray], ks: list[int]
) -> list[list[Hit]]:
    """Each query's top k results; one metadata lookup and one copy of the numbers for all."""
    tops = np.minimum(np.asarray(ks), ranked.counts)  # (Q,)
    width = int(tops.max()) if len(tops) else 0
    distances = ranked.distances[:, :width].cpu().numpy().tolist()  # (Q, width)
    log_dets = log_det(ranked.logvar[:, :width]).cpu().numpy().tolist()  # (Q, width)
    rows = np.concatenate([ranked.rows[q, :top] for q, top in enumerate(tops)])
    records = iter(index.metadata(rows.tolist()))
    hits = []
    for q, top in enumerate(tops.tolist()):
        scores = posteriors[q][:top].tolist()
        hits.append(
            [_hit(next(records), r, scores[r], distances[q][r], log_dets[q][r]) for r in range(top)]
        )
    return hits


def _hit(record: dict[str, Any], r: int, score: float, distance: float, log_det: float) -> Hit:
    meta = dict(record)
    item_id = str(meta.pop("id"))
    return Hit(item_id, r + 1, score, distance, log_det, meta)
