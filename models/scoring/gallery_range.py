"""Whether a query's mean lies outside the region the gallery occupies (issue 41.7).

Every other score judges a query relative to its shortlist: the retrieval posterior is a
softmax over distances to the candidates, so it only sees their differences. A query far from
everything (mu = -1e4 in every dimension) is about equally far from all of them, its nearest
one still takes a score of 1.0 after the softmax, and the draws agree, so mutual information
collapses to 0: the further away, the more certain it looks. A score of where the query lies
in absolute terms is needed, and it must not depend on a calibration set.

`out_of_range` is the distance of the query's mean from the centre c of the gallery's means,
in units of the gallery's radius R (the largest distance of an item's mean from c):

    out_of_range = ||mu - c|| / R

Why this measure, and its limit: a query at distance L = out_of_range * R from the centre
has every item at a distance between L - R and L + R, so the farthest item is at most
(L + R) / (L - R) times as far as the nearest. When that ratio is near 1 the ranking says
nothing (Beyer et al. 1999, "When is nearest neighbor meaningful?"): RANGE_LIMIT = 21 is
where it falls to 1.1, every item within 10% of the same distance. It is read in whole-vector
distance, not per dimension: caption and image means of a model lie apart (the modality gap:
the caption queries of the 1-epoch test model lie about 2.5 R from the image gallery's centre,
up to 2.6 gallery widths outside its range in some dimension), and a per-dimension range
would reject them; a query of the gallery's own kind scores at most 1.
It needs no calibration set, costs O(D) per query against a (D + 1) summary of the gallery
computed once per version (two O(N D) passes over the memory-mapped means, in blocks; cached
while the array lives). A gallery without spread (one item) has no radius and scores 0.
Queries scoring above RANGE_LIMIT are rejected with this score's name as the reason.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass

import numpy as np

OUT_OF_RANGE_SCORE = "out_of_range"
RANGE_LIMIT = 21.0  # (L + R) / (L - R) = 1.1: every item within 10% of the same distance
_BLOCK_ROWS = 65_536


@dataclass(frozen=True)
class GalleryRange:
    """A gallery's means summarised: their centre and radius (see the module docstring)."""

    centre: np.ndarray  # (D,) float64, the mean of the means
    radius: float  # the largest distance of an item's mean from the centre; 0: no spread

    @classmethod
    def of(cls, mu: np.ndarray) -> GalleryRange:
        """The centre and radius of the (N, D) means, read `_BLOCK_ROWS` rows at a time."""
        count, dim = mu.shape
        total = np.zeros(dim)
        for block in _blocks(mu):
            total += block.sum(axis=0)
        centre = total / max(count, 1)
        radius = 0.0
        for block in _blocks(mu):
            radius = max(radius, float(np.sqrt(((block - centre) ** 2).sum(axis=1).max())))
        return cls(centre, radius)

    def out_of_range(self, query_mu: np.ndarray) -> np.ndarray:
        """(Q,) score of (Q, D) query means; see the module docstring."""
        mu = np.asarray(query_mu, dtype=np.float64)
        if self.radius <= 0:
            return np.zeros(mu.shape[:-1])
        return np.sqrt(((mu - self.centre) ** 2).sum(axis=-1)) / self.radius


def _blocks(mu: np.ndarray):
    for start in range(0, mu.shape[0], _BLOCK_ROWS):
        yield np.asarray(mu[start : start + _BLOCK_ROWS], dtype=np.float64)


_ranges: dict[int, tuple[weakref.ref, GalleryRange]] = {}
_lock = threading.Lock()


def gallery_range(mu: np.ndarray) -> GalleryRange:
    """The GalleryRange of a gallery's means, computed once per array object (an index
    version's memory-mapped mu.npy) and forgotten when the array is.

    A live gallery's rows (indexer.live_state.RowArrays) name their `range_source`, the
    version's own means: the few items added since it was built are summarised when a
    compaction makes them a version, not on every write."""
    mu = getattr(mu, "range_source", mu)
    key = id(mu)
    with _lock:
        entry = _ranges.get(key)
        if entry is not None and entry[0]() is mu:
            return entry[1]
    found = GalleryRange.of(mu)
    try:
        ref = weakref.ref(mu, lambda _, key=key: _ranges.pop(key, None))
    except TypeError:  # an array type without weak references: not cached
        return found
    with _lock:
        _ranges[key] = (ref, found)
    return found


def out_of_range(query_mu: np.ndarray, gallery_mu: np.ndarray) -> np.ndarray:
    """(Q,) how far each query's mean lies outside the gallery's range (module docstring)."""
    return gallery_range(gallery_mu).out_of_range(query_mu)
