"""The range of per-item log-det over a gallery, so one item's uncertainty can be shown relative
to the rest of its gallery (the search page's bars)."""

import threading
from dataclasses import dataclass

import numpy as np
import torch

from indexer.store import IndexVersion
from models.scoring.uncertainty import log_det

MAX_SAMPLED_ROWS = 100_000  # larger galleries: evenly spaced rows, enough for a range


@dataclass(frozen=True)
class LogDetRange:
    """Smallest and largest log-det of the rows read (`rows` of the gallery's `count`)."""

    low: float
    high: float
    rows: int
    count: int


def log_det_range(index: IndexVersion, max_rows: int = MAX_SAMPLED_ROWS) -> LogDetRange:
    """Range of log-det over the gallery, or over `max_rows` evenly spaced rows of it."""
    count = len(index.logvar)
    if count == 0:
        return LogDetRange(0.0, 0.0, 0, 0)
    rows = np.unique(np.linspace(0, count - 1, min(count, max_rows)).astype(np.int64))
    values = log_det(torch.from_numpy(np.asarray(index.logvar[rows], np.float32)))  # (R,)
    return LogDetRange(float(values.min()), float(values.max()), len(rows), count)


class GalleryStats:
    """Computes each (gallery, version)'s range once; keeps the latest version per gallery."""

    def __init__(self) -> None:
        self._ranges: dict[str, tuple[str, LogDetRange]] = {}
        self._lock = threading.Lock()

    def log_det_range(self, modality: str, version: str, index: IndexVersion) -> LogDetRange:
        """The range of this version, computed on first use (call it off the event loop)."""
        with self._lock:
            cached = self._ranges.get(modality)
        if cached is not None and cached[0] == version:
            return cached[1]
        found = log_det_range(index)
        with self._lock:
            self._ranges[modality] = (version, found)
        return found
