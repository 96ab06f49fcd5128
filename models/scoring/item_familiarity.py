"""The familiarity gate applied to gallery items: which pictures of an image gallery would be
refused as image queries because they look unlike anything the model was trained on.

Calibration fits the gate on the caption gallery, where image queries search (indexer
.calibration: `gate_score`, novelty or log_det, and `gate_limit`). The same judgement applies
to the pictures a user indexes: ten solid-colour squares all sat past the gate, yet were
served as if the model knew them. Searches mark such results, and reindex counts them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from models.scoring.query_scores import unfamiliar


@dataclass(frozen=True)
class ItemGate:
    """A calibrated familiarity gate: the score it reads and the limit past which an image is
    unfamiliar."""

    score: str  # "novelty" or "log_det"
    limit: float

    def flags(self, log_dets: np.ndarray, novelty: np.ndarray | None) -> np.ndarray | None:
        """Whether each item is past the gate, from its log-dets and (for a novelty gate) its
        novelty values; None when the items lack the score the gate reads (a version indexed
        before novelty was stored)."""
        values = log_dets if self.score == "log_det" else novelty
        if values is None:
            return None
        return np.asarray(unfamiliar(np.asarray(values, dtype=np.float64), self.limit), bool)

    def describe(self) -> str:
        return f"{self.score} above {self.limit:.3g}"
