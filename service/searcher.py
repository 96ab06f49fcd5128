"""The query pipeline: encode -> shortlist -> exact re-rank -> uncertainty (no HTTP here).

`Searcher.search_batch` runs a micro-batch of queries in a worker thread: queries are encoded
per kind, shortlisted together per (gallery, shortlist metric, size) with one index call,
re-ranked exactly per metric with one models.scoring call, and scored with one call per
(result count, temperature, draw count). Every step computes each query's numbers as it would
alone, so a query's answer does not depend on the rest of the batch. A query's failure is
returned in its slot and never fails the others.
"""

import time
from collections import defaultdict
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import torch
from PIL import Image

from models.distance.augmented import INDEX_FAMILIES
from models.distance.gaussian import METRICS
from models.onnx.encoder_runtime import OnnxEncoder
from models.pvse.max_pair import MAX_PAIR
from models.scoring.query_scores import QueryScores, shortlist_scores
from models.scoring.rerank import RankedBatch, rerank_batch
from models.scoring.uncertainty import sample_gaussian
from service.errors import IndexUnavailableError, InvalidQueryError
from service.index_holder import IndexHolder, LoadedIndex
from service.outcome import (
    Hit,
    Outcome,
    QueryKind,
    ScoreSettings,
    Uncertainty,
    hit_lists,
)
from service.pvse_search import check_max_pair, max_pair_scores, rank_max_pair

_T = TypeVar("_T")
# A text query searches the image gallery and an image query the caption gallery.
GALLERY_OF_KIND: dict[str, str] = {"text": "image", "image": "text"}


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
    decode_ms: float = 0.0  # spent decoding `image`, counted in the encode timing


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
    identical_draws: bool = False  # every draw is (mu, logvar): an encoder without dropout


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
        default_metrics: metric of requests that name none, per gallery ("image", "text"):
            the model's (ModelConfig.default_metric).
        candidate_metric: shortlist metric for metrics without an index form
            (bhattacharyya, elk, match_prob).
        max_shortlist: cap of the default shortlist size.
    """

    def __init__(
        self,
        holder: IndexHolder,
        encoders: Mapping[str, OnnxEncoder],
        *,
        default_metrics: Mapping[str, str],
        candidate_metric: str,
        max_shortlist: int,
        device: torch.device,
    ) -> None:
        self.holder = holder
        self.encoders = dict(encoders)
        self.default_metrics = dict(default_metrics)
        self.candidate_metric = candidate_metric
        self.max_shortlist = max_shortlist
        self.device = device

    def default_metric(self, gallery: str) -> str:
        """The metric `gallery` is ranked with when a query names none."""
        return self.default_metrics[gallery]

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
                encode_ms=encode_ms + queries[i].decode_ms,
                embeddings=None if out.embeddings is None else out.embeddings[i],
                mc_embeddings=None if out.mc_embeddings is None else out.mc_embeddings[:, i],
                identical_draws=out.identical_draws,
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
        plans: list[_Plan] = []
        for position in positions:
            try:
                plans.append(self._plan(loaded, position, queries[position], encoded[position]))
            except InvalidQueryError as error:
                results[position] = error
        for (shortlist_metric, size), group in _grouped(
            plans, lambda p: (p.shortlist_metric, p.size)
        ).items():
            if shortlist_metric == MAX_PAIR:  # pvse: ranked exactly by indexer.multivector
                for plan in group:
                    results[plan.position] = self._finish_max_pair(loaded, plan)
            else:
                self._search_group(loaded, group, shortlist_metric, size, results)

    def _search_group(
        self,
        loaded: LoadedIndex,
        plans: list[_Plan],
        shortlist_metric: str,
        size: int,
        results: list,
    ) -> None:
        """Queries of one shortlist index and size: one index call, then one pass per metric."""
        start = time.perf_counter()
        mu_q, logvar_q = _stacked(plans)  # (Q, D) each
        _, rows = loaded.index.shortlist(shortlist_metric, mu_q, logvar_q, size)  # (Q, S')
        shortlist_ms = _ms_since(start)
        for same_metric in _grouped(list(enumerate(plans)), lambda item: item[1].metric).values():
            members = [plan for _, plan in same_metric]
            candidate_rows = rows[[i for i, _ in same_metric]]
            outcomes = self._finish(loaded, members, candidate_rows, shortlist_ms)
            for plan, outcome in zip(members, outcomes, strict=True):
                results[plan.position] = outcome

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
        metric = query.params.metric or self.default_metric(query.gallery)
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
        self, loaded: LoadedIndex, plans: list[_Plan], rows: np.ndarray, shortlist_ms: float
    ) -> list[Outcome]:
        """Re-rank, score and answer queries of one metric and shortlist size, all at once."""
        start = time.perf_counter()
        # The exact re-rank keeps `size` candidates: for min_kl the index returns the union
        # of two shortlists, which holds the exact top-`size`.
        index, (mu_q, logvar_q) = loaded.index, _stacked(plans)
        ranked = rerank_batch(
            plans[0].metric, mu_q, logvar_q, index.mu, index.logvar, rows, plans[0].size,
            self.device,
        )  # fmt: skip
        rerank_ms = _ms_since(start)
        start = time.perf_counter()
        settings = [_score_settings(loaded, plan) for plan in plans]
        scored = self._score_groups(plans, ranked, settings)
        timings = {"shortlist": shortlist_ms, "rerank": rerank_ms, "uncertainty": _ms_since(start)}
        hits = hit_lists(
            index, ranked, [s.posterior[j] for s, j in scored], [p.query.params.k for p in plans]
        )
        return [
            _outcome(loaded, plan, setting, scores, j, int(count), hit_list, timings)
            for plan, setting, (scores, j), count, hit_list in zip(
                plans, settings, scored, ranked.counts, hits, strict=True
            )
        ]

    def _score_groups(
        self, plans: list[_Plan], ranked: RankedBatch, settings: list[ScoreSettings]
    ) -> list[tuple[QueryScores, int]]:
        """Each query's scores and its position in them: queries with as many results, the same
        temperature and draw count are scored by one models.scoring call."""
        scored: list[tuple[QueryScores, int]] = [None] * len(plans)  # type: ignore[list-item]
        groups = _grouped(
            list(range(len(plans))),
            lambda i: (ranked.counts[i], settings[i].temperature, _draw_count(plans[i].encoded)),
        )
        for members in groups.values():
            m = int(ranked.counts[members[0]])
            whole = len(members) == len(plans) and m == ranked.mu.shape[1]
            index = slice(None) if whole else torch.as_tensor(members, device=ranked.mu.device)
            candidates = (ranked.mu[index, :m], ranked.logvar[index, :m])  # (Q', m, D) each
            encoded = [plans[i].encoded for i in members]
            captions = plans[0].query.gallery == "image"  # an image gallery is searched by text
            setting = settings[members[0]]
            scores = self._scores(plans[0].metric, encoded, candidates, setting, captions)
            for j, i in enumerate(members):
                scored[i] = (scores, j)
        return scored

    def _scores(
        self,
        metric: str,
        encoded: list[Encoded],
        candidates: tuple[torch.Tensor, torch.Tensor],
        setting: ScoreSettings,
        caption_query: bool,
    ) -> QueryScores:
        """models.scoring's scores of queries (with as many draws) over their shortlists."""

        def tensor(arrays: list[np.ndarray], axis: int = 0) -> torch.Tensor:
            stacked = np.stack(arrays, axis=axis).astype(np.float32, copy=False)
            return torch.from_numpy(stacked).to(self.device)

        query = (tensor([e.mu for e in encoded]), tensor([e.logvar for e in encoded]))  # (Q, D)
        draws = None
        if _draw_count(encoded[0]) > 0:
            draws = (
                tensor([e.mc_mu for e in encoded], axis=1),  # type: ignore[misc]  # (L, Q, D)
                tensor([e.mc_logvar for e in encoded], axis=1),  # type: ignore[misc]
            )
        identical = all(e.identical_draws for e in encoded)
        return shortlist_scores(
            metric, query, draws, candidates, setting.temperature, identical, caption_query
        )

    def _finish_max_pair(self, loaded: LoadedIndex, plan: _Plan) -> Outcome:
        """A pvse query: best-pair ranking and its scores, on its own."""
        start = time.perf_counter()
        assert plan.encoded.embeddings is not None
        ranked = rank_max_pair(loaded.index, plan.encoded.embeddings, plan.size, self.device)
        rerank_ms = _ms_since(start)
        start = time.perf_counter()
        setting, enc = _score_settings(loaded, plan), plan.encoded
        scores = max_pair_scores(
            loaded.index, enc.logvar, enc.mc_embeddings, enc.mc_mu, ranked, setting.temperature
        )
        timings = {"shortlist": 0.0, "rerank": rerank_ms, "uncertainty": _ms_since(start)}
        batch = RankedBatch.of(ranked)
        (hits,) = hit_lists(loaded.index, batch, [scores.posterior[0]], [plan.query.params.k])
        return _outcome(loaded, plan, setting, scores, 0, len(ranked.rows), hits, timings)


def _outcome(
    loaded: LoadedIndex,
    plan: _Plan,
    setting: ScoreSettings,
    scores: QueryScores,
    j: int,
    shortlist_size: int,
    hits: list[Hit],
    timings: dict[str, float],
) -> Outcome:
    """The answer of the query at position j of `scores`."""
    uncertainty = Uncertainty.at(scores, j)
    return Outcome(
        kind=plan.query.kind,
        metric=plan.metric,
        index_version=loaded.version,
        temperature=setting.temperature,
        reject_score=setting.reject_score(uncertainty),
        mc_samples=plan.query.params.mc_samples,
        shortlist_size=shortlist_size,
        uncertainty=uncertainty,
        hits=hits,
        mu=plan.encoded.mu,
        logvar=plan.encoded.logvar,
        timings_ms={"encode": plan.encoded.encode_ms, **timings},
    )


def _score_settings(loaded: LoadedIndex, plan: _Plan) -> ScoreSettings:
    params = plan.query.params
    calibration = loaded.index.manifest.calibration.get(plan.metric)
    return ScoreSettings.of(calibration, params.temperature, params.reject_threshold)


def _grouped(items: Sequence[_T], key: Callable[[_T], Hashable]) -> dict[Hashable, list[_T]]:
    """Items by key, each list in the items' order."""
    groups: dict[Hashable, list[_T]] = defaultdict(list)
    for item in items:
        groups[key(item)].append(item)
    return groups


def _stacked(plans: Sequence[_Plan]) -> tuple[np.ndarray, np.ndarray]:
    """The plans' query means and log-variances, (Q, D) float32 each."""
    mu = np.stack([p.encoded.mu for p in plans]).astype(np.float32, copy=False)
    logvar = np.stack([p.encoded.logvar for p in plans]).astype(np.float32, copy=False)
    return mu, logvar


def _draw_count(enc: Encoded) -> int:
    return 0 if enc.mc_mu is None or enc.mc_logvar is None else len(enc.mc_mu)


def _ms_since(start: float) -> float:
    return 1000 * (time.perf_counter() - start)


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
