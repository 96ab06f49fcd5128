"""Every uncertainty score of a query, computed in one place (DESIGN section 3).

Evaluation, calibration and the service all call `query_scores`, so a query with the same
embedding, draws and shortlist gets the same scores everywhere. Larger always means less sure:

- log_det: sum ln sigma^2 of the query; entropy: the Gaussian's differential entropy.
- feature_uncertainty: sum over dims of the variance of mu across the MC draws.
- mutual_information (MI): H(mean_l p_l) - mean_l H(p_l) of the retrieval posteriors
  p_l = softmax(-d_l / T) of the draws over the shortlist: the draws disagree.
- posterior_entropy: H(mean_l p_l), or H(p) of the deterministic posterior without draws: many
  candidates are about equally good (an ambiguous query), which MI does not see.
- top_mahalanobis: sum_d (mu_image - mu_caption)^2 / sigma_caption^2 of the query and its first
  result, whichever of the two is the caption: a caption's variance is fitted to the spread of
  the images it describes (models.objectives.regularizers.partner_spread_loss), so a first
  result far outside that spread is an answer the model itself does not expect to be right.
- novelty: for image queries of a model on pretrained backbones, the cosine distance of the
  image's backbone vector to the nearest training image's (models.networks.feature_novelty),
  computed by the encoder: a picture unlike anything the model was trained on.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch
from torch.nn import functional as F

from models.distance.gaussian import elementwise_distance
from models.scoring.gallery_range import out_of_range
from models.scoring.rerank import (
    RankedBatch,
    candidate_distances,
    draw_distances,
    rerank_batch,
)
from models.scoring.uncertainty import (
    entropy,
    feature_uncertainty,
    log_det,
    mutual_information,
    retrieval_posterior,
)

# The candidates are padded to a multiple of this many: torch computes exp and log of the
# elements past a tensor's last whole SIMD block with scalar code, which rounds differently,
# so without padding a query's scores would move in the last bit with the other queries of
# the call (and the service's answer with its micro-batch).
SIMD_BLOCK = 32
SCORE_NAMES: tuple[str, ...] = (
    "log_det",
    "entropy",
    "feature_uncertainty",
    "mutual_information",
    "posterior_entropy",
    "top_mahalanobis",
    "novelty",
)
TEMPERATURE_SCORES: tuple[str, ...] = ("mutual_information", "posterior_entropy")
SCORE_BLOCK = 64  # queries scored together (memory: SCORE_BLOCK x draws x shortlist x D)
DRAW_SCORES: tuple[str, ...] = ("feature_uncertainty", "mutual_information")


@dataclass
class QueryScores:
    """Scores of Q queries, each (Q,) float64; the draw scores are None without >= 1 draw,
    top_mahalanobis without the query's mean, its candidates and the side of the caption, and
    novelty for queries whose encoder does not compute it.

    `posterior` (Q, M) is the deterministic retrieval posterior softmax(-d / T) over each
    query's shortlist: the `score` of each result.
    """

    log_det: np.ndarray
    entropy: np.ndarray
    feature_uncertainty: np.ndarray | None
    mutual_information: np.ndarray | None
    posterior_entropy: np.ndarray
    posterior: np.ndarray
    top_mahalanobis: np.ndarray | None = None
    novelty: np.ndarray | None = None
    # how far the query's mean lies outside the gallery's range (models.scoring.gallery_range);
    # not a calibrated score (not in SCORE_NAMES): above RANGE_LIMIT it rejects on its own
    out_of_range: np.ndarray | None = None

    def get(self, name: str) -> np.ndarray | None:
        """The (Q,) values of one score by name (SCORE_NAMES)."""
        if name not in SCORE_NAMES:
            raise ValueError(f"unknown score {name!r}; choose one of {', '.join(SCORE_NAMES)}")
        return getattr(self, name)

    def available(self) -> dict[str, np.ndarray]:
        """name -> (Q,) values of every score that could be computed."""
        return {n: v for n in SCORE_NAMES if (v := self.get(n)) is not None}


class GaussianQueries(Protocol):
    """Q encoded queries (models.onnx.encoder_runtime.Embeddings is one): mu, logvar (Q, D) and
    the MC draws mc_mu, mc_logvar (L, Q, D) or None; identical_draws: every draw is the
    deterministic embedding (an encoder without dropout); novelty (Q,) or None."""

    mu: np.ndarray
    logvar: np.ndarray
    mc_mu: np.ndarray | None
    mc_logvar: np.ndarray | None
    identical_draws: bool
    novelty: np.ndarray | None


@dataclass
class ScoredShortlists:
    """Q queries' shortlists after the exact re-rank, and their scores at each temperature.

    Queries with as many results are scored together: `groups[i]` holds the query positions
    of group i, and `scores[T][i]` their QueryScores in that order. `timings_ms` holds the ms
    of the two steps, "rerank" and "uncertainty".
    """

    ranked: RankedBatch
    groups: list[np.ndarray]
    scores: dict[float, list[QueryScores]]
    timings_ms: dict[str, float]

    def query(self, q: int, temperature: float) -> tuple[QueryScores, int]:
        """The QueryScores holding query q at `temperature`, and q's position in them."""
        group, position = self._where[q]
        return self.scores[temperature][group], position

    @functools.cached_property
    def _where(self) -> dict[int, tuple[int, int]]:
        """query -> (its group, its position in the group)."""
        return {
            int(q): (i, j) for i, members in enumerate(self.groups) for j, q in enumerate(members)
        }

    def values(self, temperature: float) -> dict[str, np.ndarray]:
        """name -> (Q,) values of every score computed for all the queries, at `temperature`."""
        num_queries = len(self.ranked.counts)
        out: dict[str, np.ndarray] = {}
        for members, scores in zip(self.groups, self.scores[temperature], strict=True):
            for name, value in scores.available().items():
                out.setdefault(name, np.full(num_queries, np.nan))[members] = value
        return out


def score_shortlists(
    metric: str,
    queries: GaussianQueries,
    gallery: tuple[np.ndarray, np.ndarray],
    candidate_rows: np.ndarray,
    keep: int,
    temperatures: Sequence[float],
    caption_query: bool | None,
    device: torch.device,
) -> ScoredShortlists:
    """The last stage of every search, shared by the service and calibration: re-rank each
    query's candidate rows exactly (rerank_batch, keeping `keep`), then score each query over
    its re-ranked shortlist at every temperature (distances computed once).

    gallery: the whole gallery's (mu, logvar) (N, D); candidate_rows: (Q, C) rows proposed by
    the index (-1 padding and repeats are dropped). Every step computes a query's numbers as
    it would alone, so its scores do not depend on the rest of the batch.
    """
    start = time.perf_counter()
    ranked = rerank_batch(
        metric, queries.mu, queries.logvar, *gallery, candidate_rows, keep, device
    )
    rerank_ms, start = 1000 * (time.perf_counter() - start), time.perf_counter()
    groups, scores = [], {float(t): [] for t in temperatures}
    far = out_of_range(queries.mu, gallery[0])  # (Q,)
    by_count: dict[int, list[int]] = {}
    for q, count in enumerate(ranked.counts.tolist()):
        by_count.setdefault(count, []).append(q)
    for count, same in by_count.items():
        for first in range(0, len(same), SCORE_BLOCK):
            members = np.array(same[first : first + SCORE_BLOCK])
            block = _block_scores(
                metric, queries, members, ranked, count, temperatures, caption_query
            )
            groups.append(members)
            for temperature, scored in zip(scores, block, strict=True):
                scored.out_of_range = far[members]
                scores[temperature].append(scored)
    timings = {"rerank": rerank_ms, "uncertainty": 1000 * (time.perf_counter() - start)}
    return ScoredShortlists(ranked, groups, scores, timings)


def _block_scores(
    metric: str,
    queries: GaussianQueries,
    members: np.ndarray,
    ranked: RankedBatch,
    count: int,
    temperatures: Sequence[float],
    caption_query: bool | None,
) -> list[QueryScores]:
    """shortlist_scores of the queries at `members`, which all have `count` results."""
    device = ranked.mu.device
    whole = len(members) == len(ranked.counts) and count == ranked.mu.shape[1]  # all, in order
    index = slice(None) if whole else torch.as_tensor(members, device=device)
    candidates = (ranked.mu[index, :count], ranked.logvar[index, :count])  # (Q', M, D) each
    distances = ranked.distances[index, :count]  # (Q', M): the re-rank's, not computed again

    def tensor(array: np.ndarray, axis: int) -> torch.Tensor:
        picked = array if whole else np.take(array, members, axis=axis)
        return torch.from_numpy(np.ascontiguousarray(picked, dtype=np.float32)).to(device)

    query = (tensor(queries.mu, 0), tensor(queries.logvar, 0))  # (Q', D) each
    draws = None
    if queries.mc_mu is not None and queries.mc_logvar is not None:
        draws = (tensor(queries.mc_mu, 1), tensor(queries.mc_logvar, 1))  # (L, Q', D) each
    novelty = None if queries.novelty is None else np.take(queries.novelty, members)
    return block_scores(
        metric, query, draws, candidates, temperatures, queries.identical_draws, caption_query,
        novelty, distances,
    )  # fmt: skip


def shortlist_scores(
    metric: str,
    query: tuple[torch.Tensor, torch.Tensor],
    draws: tuple[torch.Tensor, torch.Tensor] | None,
    candidates: tuple[torch.Tensor, torch.Tensor],
    temperature: float,
    identical_draws: bool = False,
    caption_query: bool | None = None,
    distances: torch.Tensor | None = None,
) -> QueryScores:
    """query_scores of Q queries from their embeddings and shortlists, at one temperature.

    query: (mu, logvar) (Q, D); draws: (mc_mu, mc_logvar) (L, Q, D) or None; candidates:
    (mu, logvar) (Q, M, D) of each query's shortlist, in its order. identical_draws: every
    draw equals its query (an encoder without dropout), so they are not computed
    (agreeing_draws). caption_query: the queries are captions (True) or images (False);
    None leaves top_mahalanobis out. distances: (Q, M), the re-rank's distances of the
    candidates, used instead of computing them again.
    """
    (scores,) = block_scores(
        metric, query, draws, candidates, [temperature], identical_draws, caption_query,
        distances=distances,
    )  # fmt: skip
    return scores


def block_scores(
    metric: str,
    query: tuple[torch.Tensor, torch.Tensor],
    draws: tuple[torch.Tensor, torch.Tensor] | None,
    candidates: tuple[torch.Tensor, torch.Tensor],
    temperatures: Sequence[float],
    identical_draws: bool = False,
    caption_query: bool | None = None,
    novelty: np.ndarray | None = None,
    distances: torch.Tensor | None = None,
) -> list[QueryScores]:
    """shortlist_scores at each of `temperatures`, from one computation of the distances;
    `novelty` (Q,): the queries' novelty from their encoder, passed through; `distances`
    (Q, M): the queries' distances to their candidates where the re-rank computed them."""
    if draws is not None and draws[0].shape[0] > 0 and identical_draws:
        alone = block_scores(
            metric, query, None, candidates, temperatures, False, caption_query, novelty,
            distances,
        )  # fmt: skip
        return [agreeing_draws(scores) for scores in alone]
    distances, mc_distances = shortlist_distances(metric, query, draws, candidates, distances)
    mc_mu = None if mc_distances is None or draws is None else draws[0]
    fit = None if caption_query is None else CaptionFit(query[0], candidates, caption_query)
    return scores_at_temperatures(
        query[1], distances, temperatures, mc_mu, mc_distances, fit, novelty
    )


def agreeing_draws(scores: QueryScores) -> QueryScores:
    """The scores of queries whose MC draws all equal their deterministic embedding (a model
    without dropout), from their scores without draws: the draws do not vary, so the feature
    uncertainty and the MI are 0 and their mean posterior is the deterministic one."""
    zeros = np.zeros_like(scores.log_det)
    return dataclasses.replace(scores, feature_uncertainty=zeros, mutual_information=zeros.copy())


def shortlist_distances(
    metric: str,
    query: tuple[torch.Tensor, torch.Tensor],
    draws: tuple[torch.Tensor, torch.Tensor] | None,
    candidates: tuple[torch.Tensor, torch.Tensor],
    distances: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Distances (Q, M) of the queries and (L, Q, M) of their draws (None without draws) to
    their shortlists: what query_scores needs, computed once for any number of temperatures.
    `distances` given (the re-rank's, bit for bit what candidate_distances computes) are
    used as they are."""
    mu, logvar = query
    if distances is None:
        distances = candidate_distances(metric, mu, logvar, *candidates)  # (Q, M)
    if draws is None or draws[0].shape[0] == 0:
        return distances, None
    return distances, draw_distances(metric, *draws, *candidates)  # (L, Q, M)


@dataclass(frozen=True)
class CaptionFit:
    """What top_mahalanobis needs beside the distances: the queries' means (Q, D), their
    shortlists' (mu, logvar) (Q, M, D), and whether the queries are the captions."""

    query_mu: torch.Tensor
    candidates: tuple[torch.Tensor, torch.Tensor]
    caption_query: bool

    def top_mahalanobis(self, query_logvar: torch.Tensor, distances: torch.Tensor) -> np.ndarray:
        """(Q,) Mahalanobis distance of each image mean under its caption's Gaussian, for the
        query and its first result (the smallest of `distances` (Q, M))."""
        first = distances.argmin(dim=-1)  # (Q,)
        rows = torch.arange(first.shape[0], device=first.device)
        top = (self.candidates[0][rows, first].double(), self.candidates[1][rows, first].double())
        query = (self.query_mu.double(), query_logvar.double())
        image, caption = (top, query) if self.caption_query else (query, top)
        return elementwise_distance("mahalanobis", *image, *caption).cpu().numpy()


def _entropy_of(p: torch.Tensor) -> torch.Tensor:
    """Shannon entropy (nats) over the last dim, 0 * ln 0 = 0."""
    return -torch.where(p > 0, p * torch.log(p), torch.zeros_like(p)).sum(dim=-1)


def query_scores(
    logvar: torch.Tensor,
    distances: torch.Tensor,
    temperature: float,
    mc_mu: torch.Tensor | None = None,
    mc_distances: torch.Tensor | None = None,
    fit: CaptionFit | None = None,
    novelty: np.ndarray | None = None,
) -> QueryScores:
    """Scores of Q queries over their shortlists.

    Args:
        logvar: (Q, D) the queries' deterministic log-variances.
        distances: (Q, M) deterministic distances to each query's M shortlisted candidates
            (+inf marks padding).
        temperature: T of the retrieval posterior.
        mc_mu: (L, Q, D) means of the L MC draws, or None.
        mc_distances: (L, Q, M) distances of each draw to the same candidates, or None.
        fit: the means and side of the caption that top_mahalanobis needs, or None.
        novelty: (Q,) the queries' novelty from their encoder, or None.
    """
    (scores,) = scores_at_temperatures(
        logvar, distances, [temperature], mc_mu, mc_distances, fit, novelty
    )
    return scores


def scores_at_temperatures(
    logvar: torch.Tensor,
    distances: torch.Tensor,
    temperatures: Sequence[float],
    mc_mu: torch.Tensor | None = None,
    mc_distances: torch.Tensor | None = None,
    fit: CaptionFit | None = None,
    novelty: np.ndarray | None = None,
) -> list[QueryScores]:
    """query_scores at each of `temperatures`: the scores that do not depend on T (log-det,
    entropy, feature uncertainty, top_mahalanobis, novelty) are computed once and shared."""
    num_candidates = distances.shape[-1]
    if num_candidates == 0:
        return [_without_candidates(logvar, mc_mu, novelty) for _ in temperatures]
    draws = mc_mu is not None and mc_distances is not None and mc_mu.shape[0] > 0
    feature = feature_uncertainty(mc_mu.double()).cpu().numpy() if draws else None
    shared = {
        "log_det": log_det(logvar.double()).cpu().numpy(),
        "entropy": entropy(logvar.double()).cpu().numpy(),
        "feature_uncertainty": feature,
        "top_mahalanobis": None if fit is None else fit.top_mahalanobis(logvar, distances),
        "novelty": None if novelty is None else np.asarray(novelty, dtype=np.float64),
    }
    padded = _padded(distances)  # (Q, M')
    padded_draws = _padded(mc_distances) if draws else None  # (L, Q, M')
    return [
        QueryScores(**shared, **_posterior_scores(padded, padded_draws, t, num_candidates))
        for t in temperatures
    ]


def _posterior_scores(
    padded: torch.Tensor, padded_draws: torch.Tensor | None, temperature: float, count: int
) -> dict[str, np.ndarray | None]:
    """The scores that depend on T: the posterior over the `count` candidates, its entropy
    (averaged over the draws when there are draws) and the mutual information."""
    posterior = retrieval_posterior(padded, temperature)  # (Q, M')
    mi = None
    mean_posterior = posterior
    if padded_draws is not None:
        mi = mutual_information(padded_draws, temperature).clamp(max=math.log(count))
        mi = mi.cpu().numpy()
        mean_posterior = retrieval_posterior(padded_draws, temperature).mean(dim=0)
    return {
        "mutual_information": mi,
        "posterior_entropy": _entropy_of(mean_posterior).cpu().numpy(),
        "posterior": posterior[..., :count].cpu().numpy(),
    }


def _without_candidates(
    logvar: torch.Tensor, mc_mu: torch.Tensor | None, novelty: np.ndarray | None
) -> QueryScores:
    """Scores of queries with an empty shortlist (a filter that matches no item): those of
    the query itself; nothing to retrieve, so no posterior and no mutual information."""
    feature = None
    if mc_mu is not None and mc_mu.shape[0] > 0:
        feature = feature_uncertainty(mc_mu.double()).cpu().numpy()
    count = logvar.shape[0]
    return QueryScores(
        log_det=log_det(logvar.double()).cpu().numpy(),
        entropy=entropy(logvar.double()).cpu().numpy(),
        feature_uncertainty=feature,
        mutual_information=None,
        posterior_entropy=np.zeros(count),
        posterior=np.zeros((count, 0)),
        novelty=None if novelty is None else np.asarray(novelty, dtype=np.float64),
    )


def _padded(distances: torch.Tensor) -> torch.Tensor:
    """float64 distances with +inf (probability 0) appended to a multiple of SIMD_BLOCK
    candidates."""
    extra = -distances.shape[-1] % SIMD_BLOCK
    return F.pad(distances.double(), (0, extra), value=math.inf)


def unfamiliar(values: np.ndarray | float, limit: float | None) -> np.ndarray | bool:
    """Whether a query's familiarity score (the calibration's gate_score: novelty, or log_det
    for a model without it) is above the gate `limit` (indexer.calibration): an image unlike
    the training images, rejected whatever its reject score. None: no gate."""
    if limit is None:
        return np.zeros(np.shape(values), dtype=bool) if np.ndim(values) else False
    return np.asarray(values) > limit if np.ndim(values) else bool(values > limit)


def gated(values: np.ndarray, gate_values: np.ndarray, limit: float | None) -> np.ndarray:
    """A reject score with the familiarity gate folded in: +inf where the query is unfamiliar
    (its gate score above `limit`), so it is rejected whatever the threshold."""
    return np.where(unfamiliar(gate_values, limit), np.inf, values)
