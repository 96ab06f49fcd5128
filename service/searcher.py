"""The query pipeline: encode -> shortlist -> exact re-rank -> uncertainty (no HTTP here).

`Searcher.search_batch` runs a micro-batch of queries in a worker thread: queries are encoded
per kind, shortlisted together per (gallery, metric, size) with one index call, then each is
re-ranked exactly and scored on its own shortlist. A query's failure is returned in its slot
and never fails the others.
"""

import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch
from PIL import Image

from models.augmented import INDEX_FAMILIES
from models.encoder_runtime import OnnxEncoder
from models.gaussian import METRICS
from models.pvse.max_pair import MAX_PAIR
from models.scoring.query_scores import QueryScores, shortlist_scores
from models.scoring.rerank import Ranked, exact_rerank
from models.uncertainty import log_det, sample_gaussian
from service.errors import IndexUnavailableError, InvalidQueryError
from service.index_holder import IndexHolder, LoadedIndex
from service.pvse_search import check_max_pair, max_pair_scores, rank_max_pair

QueryKind = Literal["text", "image", "embedding"]
# A text query searches the image gallery and an image query the caption gallery.
GALLERY_OF_KIND: dict[str, str] = {"text": "image", "image": "text"}
DEFAULT_TEMPERATURE = 1.0
DEFAULT_REJECT_SCORE = "mutual_information"  # of a version that was never calibrated


def default_shortlist(k: int) -> int:
    """Shortlist size when a request sets none: max(10 * k, 100)."""
    return max(10 * k, 100)


@dataclass(frozen=True)
class SearchParams:
    """Validated search options (None: the calibrated or configured default)."""

    k: int
    metric: str | None
    shortlist: int | None
    mc_samples: int
    temperature: float | None
    reject_threshold: float | None
    return_embedding: bool


@dataclass
class Query:
    """One search: exactly one of text, image or (mu, logvar) is set."""

    kind: QueryKind
    gallery: str
    params: SearchParams
    seed: int  # of the MC draws, derived from the canonical request
    text: str | None = None
    image: Image.Image | None = None
    mu: np.ndarray | None = None  # (D,)
    logvar: np.ndarray | None = None  # (D,)


@dataclass
class Encoded:
    """A query's Gaussian and its MC draws."""

    mu: np.ndarray  # (D,)
    logvar: np.ndarray  # (D,)
    mc_mu: np.ndarray | None  # (L, D)
    mc_logvar: np.ndarray | None  # (L, D)
    encode_ms: float
    embeddings: np.ndarray | None = None  # (K, D) of a pvse encoder
    mc_embeddings: np.ndarray | None = None  # (L, K, D)


@dataclass
class Hit:
    """One result."""

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

    @classmethod
    def of(cls, scores: QueryScores) -> "Uncertainty":
        """The first query's scores."""
        return cls(**{name: _first(scores.get(name)) for name in cls.__dataclass_fields__})


def _first(values: np.ndarray | None) -> float | None:
    return None if values is None else float(values[0])


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


@dataclass
class _Plan:
    """How one query is served by the loaded index."""

    position: int
    query: Query
    encoded: Encoded
    metric: str
    shortlist_metric: str
    size: int


class Searcher:
    """Runs batches of queries against the versions held by an IndexHolder.

    Args:
        encoders: the query encoders by query kind ("text", "image").
        default_metric: metric of requests that name none (the model's training metric).
        candidate_metric: shortlist metric for metrics without an index form
            (bhattacharyya, elk, match_prob).
        max_shortlist: cap of the default shortlist size.
    """

    def __init__(
        self,
        holder: IndexHolder,
        encoders: Mapping[str, OnnxEncoder],
        *,
        default_metric: str,
        candidate_metric: str,
        max_shortlist: int,
        device: torch.device,
    ) -> None:
        self.holder = holder
        self.encoders = dict(encoders)
        self.default_metric = default_metric
        self.candidate_metric = candidate_metric
        self.max_shortlist = max_shortlist
        self.device = device

    def search_batch(self, queries: Sequence[Query]) -> list["Outcome | Exception"]:
        """Answer every query; a failed query gets its exception in its slot."""
        results: list[Outcome | Exception | None] = [None] * len(queries)
        encoded = self._encode_all(queries, results)
        by_gallery: dict[str, list[int]] = defaultdict(list)
        for position in encoded:
            by_gallery[queries[position].gallery].append(position)
        for gallery, positions in by_gallery.items():
            try:
                with self.holder.acquire(gallery) as loaded:
                    self._search_gallery(loaded, queries, encoded, positions, results)
            except IndexUnavailableError as error:
                for position in positions:
                    results[position] = error
        return [r if r is not None else RuntimeError("query was not answered") for r in results]

    # ----- encode -----------------------------------------------------------------------

    def _encode_all(self, queries: Sequence[Query], results: list) -> dict[int, Encoded]:
        """Encode every query; encoder errors go into `results`."""
        encoded: dict[int, Encoded] = {}
        for position, query in enumerate(queries):
            if query.kind == "embedding":
                encoded[position] = _sample_embedding(query)
        # Queries of one kind and draw count share one encoder call; each brings its own seed,
        # so its MC draws do not depend on the rest of the batch.
        groups: dict[tuple[str, int], list[int]] = defaultdict(list)
        for position, query in enumerate(queries):
            if query.kind != "embedding":
                groups[(query.kind, query.params.mc_samples)].append(position)
        for (kind, _), positions in groups.items():
            try:
                encoded.update(self._encode_group(kind, [queries[p] for p in positions], positions))
            except IndexUnavailableError as error:
                for position in positions:
                    results[position] = error
            except ValueError as error:
                for position in positions:
                    results[position] = InvalidQueryError(f"the query cannot be encoded: {error}")
        return encoded

    def _encode_group(
        self, kind: str, queries: list[Query], positions: list[int]
    ) -> dict[int, Encoded]:
        encoder = self.encoders.get(kind)
        if encoder is None:
            raise IndexUnavailableError(f"no {kind} encoder is loaded")
        mc_samples, seeds = queries[0].params.mc_samples, [q.seed for q in queries]
        start = time.perf_counter()
        if kind == "text":
            out = encoder.encode_texts([q.text or "" for q in queries], mc_samples, seeds)
        else:
            out = encoder.encode_images([q.image for q in queries], mc_samples, seeds)
        encode_ms = 1000 * (time.perf_counter() - start)
        return {
            position: Encoded(
                mu=out.mu[i],
                logvar=out.logvar[i],
                mc_mu=None if out.mc_mu is None else out.mc_mu[:, i],
                mc_logvar=None if out.mc_logvar is None else out.mc_logvar[:, i],
                encode_ms=encode_ms,
                embeddings=None if out.embeddings is None else out.embeddings[i],
                mc_embeddings=None if out.mc_embeddings is None else out.mc_embeddings[:, i],
            )
            for i, position in enumerate(positions)
        }

    # ----- shortlist, re-rank, uncertainty ----------------------------------------------

    def _search_gallery(
        self,
        loaded: LoadedIndex,
        queries: Sequence[Query],
        encoded: dict[int, Encoded],
        positions: list[int],
        results: list,
    ) -> None:
        plans: dict[tuple[str, int], list[_Plan]] = defaultdict(list)
        for position in positions:
            try:
                plan = self._plan(loaded, position, queries[position], encoded[position])
            except InvalidQueryError as error:
                results[position] = error
                continue
            plans[(plan.shortlist_metric, plan.size)].append(plan)
        for (shortlist_metric, size), group in plans.items():
            if shortlist_metric == MAX_PAIR:  # pvse: ranked exactly by indexer.multivector
                for plan in group:
                    results[plan.position] = self._finish(loaded, plan, np.empty(0, np.int64), 0.0)
                continue
            start = time.perf_counter()
            mu_q = np.stack([p.encoded.mu for p in group]).astype(np.float32)  # (Q, D)
            logvar_q = np.stack([p.encoded.logvar for p in group]).astype(np.float32)  # (Q, D)
            _, rows = loaded.index.shortlist(shortlist_metric, mu_q, logvar_q, size)  # (Q, S')
            shortlist_ms = 1000 * (time.perf_counter() - start)
            for plan, candidate_rows in zip(group, rows, strict=True):
                results[plan.position] = self._finish(loaded, plan, candidate_rows, shortlist_ms)

    def shortlist_metric(self, metric: str) -> str:
        """The index a metric is shortlisted from: its own, or for metrics without an index
        form the candidate metric's (then re-ranked exactly)."""
        return metric if metric in INDEX_FAMILIES else self.candidate_metric

    def available_metrics(self, loaded: LoadedIndex) -> list[str]:
        """The metrics a query may name against this loaded version."""
        return [m for m in METRICS if loaded.index.supports(self.shortlist_metric(m))]

    def _plan(self, loaded: LoadedIndex, position: int, query: Query, enc: Encoded) -> _Plan:
        index, manifest = loaded.index, loaded.index.manifest
        if enc.mu.shape[-1] != manifest.dim:
            raise InvalidQueryError(
                f"the query embedding has {enc.mu.shape[-1]} dimensions but the {query.gallery} "
                f"index {loaded.version} holds {manifest.dim}-dimensional embeddings"
            )
        metric = query.params.metric or self.default_metric
        k = query.params.k
        size = query.params.shortlist or min(default_shortlist(k), self.max_shortlist)
        if metric == MAX_PAIR:
            check_max_pair(index, query.gallery, enc.embeddings)
            return _Plan(position, query, enc, metric, MAX_PAIR, max(size, k))
        shortlist_metric = self.shortlist_metric(metric)
        if not index.supports(shortlist_metric):
            raise InvalidQueryError(
                f"metric {metric!r} is not available in the {query.gallery} index "
                f"{loaded.version} (its shortlist needs the {shortlist_metric!r} index); "
                f"choose one of: {', '.join(manifest.metrics)}"
            )
        return _Plan(position, query, enc, metric, shortlist_metric, max(size, k))

    def _finish(
        self, loaded: LoadedIndex, plan: _Plan, candidate_rows: np.ndarray, shortlist_ms: float
    ) -> Outcome:
        start = time.perf_counter()
        # The exact re-rank keeps `size` candidates: for min_kl the index returns the union
        # of two shortlists, which holds the exact top-`size`.
        ranked = self._rank(loaded, plan, candidate_rows)
        rerank_ms = 1000 * (time.perf_counter() - start)
        return self._outcome(loaded, plan, ranked, shortlist_ms, rerank_ms)

    def _rank(self, loaded: LoadedIndex, plan: _Plan, candidate_rows: np.ndarray) -> Ranked:
        index = loaded.index
        if plan.metric == MAX_PAIR:
            assert plan.encoded.embeddings is not None
            return rank_max_pair(index, plan.encoded.embeddings, plan.size, self.device)
        return exact_rerank(
            plan.metric,
            plan.encoded.mu,
            plan.encoded.logvar,
            index.mu,
            index.logvar,
            candidate_rows,
            plan.size,
            self.device,
        )

    def _outcome(
        self,
        loaded: LoadedIndex,
        plan: _Plan,
        ranked: Ranked,
        shortlist_ms: float,
        rerank_ms: float,
    ) -> Outcome:
        index, params = loaded.index, plan.query.params
        start = time.perf_counter()
        calibration = loaded.index.manifest.calibration.get(plan.metric)
        temperature = params.temperature or (
            calibration.temperature if calibration is not None else DEFAULT_TEMPERATURE
        )
        threshold = params.reject_threshold
        if threshold is None and calibration is not None:
            threshold = calibration.threshold
        score_name = calibration.score if calibration is not None else DEFAULT_REJECT_SCORE
        enc = plan.encoded
        if plan.metric == MAX_PAIR:
            scores = max_pair_scores(
                index, enc.logvar, enc.mc_embeddings, enc.mc_mu, ranked, temperature
            )
        else:
            scores = self._scores(plan.metric, enc, ranked, temperature)
        unc = Uncertainty.of(scores)
        reject = RejectScore(score_name, _first(scores.get(score_name)), threshold)
        uncertainty_ms = 1000 * (time.perf_counter() - start)
        return Outcome(
            kind=plan.query.kind,
            metric=plan.metric,
            index_version=loaded.version,
            temperature=float(temperature),
            reject_score=reject,
            mc_samples=params.mc_samples,
            shortlist_size=len(ranked.rows),
            uncertainty=unc,
            hits=self._hits(index, ranked, scores.posterior[0], params.k),
            mu=enc.mu,
            logvar=enc.logvar,
            timings_ms={
                "encode": enc.encode_ms,
                "shortlist": shortlist_ms,
                "rerank": rerank_ms,
                "uncertainty": uncertainty_ms,
            },
        )

    def _scores(self, metric: str, enc: Encoded, ranked: Ranked, temperature: float) -> QueryScores:
        """models.scoring's scores of one query over its re-ranked shortlist."""

        def tensor(array: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(np.asarray(array, dtype=np.float32)).to(self.device)

        query = (tensor(enc.mu)[None], tensor(enc.logvar)[None])  # (1, D) each
        draws = None
        if enc.mc_mu is not None and enc.mc_logvar is not None and len(enc.mc_mu) > 0:
            draws = (tensor(enc.mc_mu)[:, None], tensor(enc.mc_logvar)[:, None])  # (L, 1, D)
        candidates = (ranked.mu[None], ranked.logvar[None])  # (1, M, D) each
        return shortlist_scores(metric, query, draws, candidates, temperature)

    @staticmethod
    def _hits(index: Any, ranked: Ranked, posterior: np.ndarray, k: int) -> list[Hit]:
        rows = ranked.rows[:k]
        metadata = index.metadata(rows.tolist())
        distances = ranked.distances[:k].cpu().numpy()
        result_log_det = log_det(ranked.logvar[:k]).cpu().numpy()
        hits = []
        for rank, (meta, distance) in enumerate(zip(metadata, distances, strict=True), start=1):
            meta = dict(meta)
            item_id = str(meta.pop("id"))
            hits.append(
                Hit(
                    id=item_id,
                    rank=rank,
                    score=float(posterior[rank - 1]),
                    distance=float(distance),
                    log_det=float(result_log_det[rank - 1]),
                    metadata=meta,
                )
            )
        return hits


def _sample_embedding(query: Query) -> Encoded:
    """A caller-supplied Gaussian; its MC draws are samples of that Gaussian (same logvar)."""
    assert query.mu is not None and query.logvar is not None
    start = time.perf_counter()
    mu = np.asarray(query.mu, dtype=np.float32)  # (D,)
    logvar = np.asarray(query.logvar, dtype=np.float32)  # (D,)
    mc_mu = mc_logvar = None
    if query.params.mc_samples > 0:
        generator = torch.Generator().manual_seed(query.seed)
        draws = sample_gaussian(
            torch.from_numpy(mu)[None], torch.from_numpy(logvar)[None],
            query.params.mc_samples, generator,
        )  # fmt: skip  # (L, 1, D)
        mc_mu = draws[:, 0].numpy()  # (L, D)
        mc_logvar = np.broadcast_to(logvar, mc_mu.shape).copy()  # (L, D)
    return Encoded(mu, logvar, mc_mu, mc_logvar, 1000 * (time.perf_counter() - start))
