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
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import torch
from PIL import Image

from indexer.live_index import LiveWriteError
from indexer.metadata_filter import FilterError, MetadataFilter
from indexer.store import UnsupportedMetricError
from models.distance.augmented import INDEX_FAMILIES
from models.distance.gaussian import METRICS
from models.onnx.encoder_runtime import Embeddings, OnnxEncoder
from models.pvse.max_pair import MAX_PAIR
from models.scoring.item_familiarity import ItemGate
from models.scoring.known_words import KnownWords, WordCheck
from models.scoring.query_scores import QueryScores, score_shortlists
from models.scoring.rerank import RankedBatch
from models.scoring.uncertainty import sample_gaussian
from models.settings import Settings
from service.errors import IndexUnavailableError, InvalidQueryError
from service.index_holder import IndexHolder, LoadedIndex
from service.outcome import (
    QueryKind,
    ScoreSettings,
    SearchHit,
    SearchResponse,
    Timings,
    hit_lists,
    query_info,
)
from service.pvse_search import check_max_pair, max_pair_scores, rank_max_pair

_T = TypeVar("_T")
# A text query searches the image gallery and an image query the caption gallery.
GALLERY_OF_KIND: dict[str, str] = {"text": "image", "image": "text"}
KIND_OF_GALLERY: dict[str, str] = {gallery: kind for kind, gallery in GALLERY_OF_KIND.items()}


def default_shortlist(k: int) -> int:
    """Shortlist size when a request sets none: max(10 * k, 100)."""
    return max(10 * k, 100)


@dataclass(frozen=True)
class SearchParams:
    """A request's search options within the limits, every default filled in (Searcher.params,
    the one place that does either). temperature and reject_threshold None: the metric's
    calibration decides."""

    k: int
    metric: str
    shortlist: int
    mc_samples: int
    temperature: float | None
    reject_threshold: float | None
    return_embedding: bool
    filter: MetadataFilter | None = None

    def identity(self) -> dict[str, Any]:
        """The options as JSON values (what the result cache keys on)."""
        values = dict(vars(self))
        values["filter"] = None if self.filter is None else self.filter.cache_key()
        return values


@dataclass(frozen=True)
class QueryInput:
    """What a search request asks, as parsed: exactly one of text, the image file's bytes or
    (mu, logvar) is set. `options` are its search options as sent (SearchOptions.options),
    checked and completed by Searcher.params once the version is pinned. `identity` is the
    query as sent (its text, the image's sha256, or the embedding's values as they came), what
    its MC draws are seeded from. The query (Query) is made from it on a cache miss only, so
    that a hit skips decoding an image."""

    kind: QueryKind
    gallery: str
    options: dict[str, Any]
    identity: dict[str, Any]
    text: str | None = None
    image_bytes: bytes | None = None
    mu: np.ndarray | None = None  # (D,) float32
    logvar: np.ndarray | None = None  # (D,) float32
    features: np.ndarray | None = None  # (F,) float32, a backbone vector

    def query(
        self,
        params: SearchParams,
        seed: int,
        loaded: LoadedIndex,
        image: Image.Image | None = None,
        decode_ms: float = 0.0,
    ) -> "Query":
        """The query to search in the pinned version `loaded`, with its checked options, its
        seed (and its image, decoded)."""
        return Query(
            self.kind, self.gallery, params, seed, text=self.text, image=image,
            mu=self.mu, logvar=self.logvar, features=self.features, decode_ms=decode_ms,
            loaded=loaded,
        )  # fmt: skip


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
    features: np.ndarray | None = None  # (F,) a backbone vector, for the heads of `encoder_kind`
    decode_ms: float = 0.0  # spent decoding `image`, counted in the encode timing
    loaded: LoadedIndex | None = None  # the version it was pinned to; None: the current one


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
    novelty: float | None = None  # image queries of a model on pretrained backbones
    words: WordCheck | None = None  # caption queries of a model that records its known words


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
        settings: the request limits, the default draw count, and the shortlist metric of
            metrics without an index form (candidate_metric: bhattacharyya, elk, match_prob).
        model_name: what each answer names as its model.
    """

    def __init__(
        self,
        holder: IndexHolder,
        encoders: Mapping[str, OnnxEncoder],
        *,
        default_metrics: Mapping[str, str],
        settings: Settings,
        model_name: str,
        device: torch.device,
        known_words: KnownWords | None = None,
    ) -> None:
        self.holder = holder
        self.known_words = known_words
        self.model_name = model_name
        self.encoders = dict(encoders)
        self.default_metrics = dict(default_metrics)
        self.settings = settings
        self.device = device

    def default_metric(self, gallery: str) -> str:
        """The metric `gallery` is ranked with when a query names none."""
        return self.default_metrics[gallery]

    def params(
        self,
        gallery: str,
        loaded: LoadedIndex | None = None,
        *,
        k: int = 10,
        metric: str | None = None,
        shortlist: int | None = None,
        mc_samples: int | None = None,
        temperature: float | None = None,
        reject_threshold: float | None = None,
        return_embedding: bool = False,
        filter: dict[str, Any] | None = None,
    ) -> SearchParams:
        """A request's options checked against the configured limits and the version it was
        pinned to, with the defaults filled in (None: the default): the metric `gallery` is
        ranked with, a shortlist of max(10 * k, 100) within max_shortlist, the configured draw
        count. The metric, named or default, must be one of available_metrics(loaded), the
        list GET /v1/config gives. `loaded` None skips that check, for callers below the HTTP
        edge that build their own queries (tests, benchmarks)."""
        limits = self.settings
        if k > limits.max_k:
            raise InvalidQueryError(f"k={k} is above the limit {limits.max_k}; ask for fewer")
        if shortlist is not None and shortlist > limits.max_shortlist:
            raise InvalidQueryError(
                f"shortlist={shortlist} is above the limit {limits.max_shortlist}"
            )
        if shortlist is not None and shortlist < k:
            raise InvalidQueryError(f"shortlist={shortlist} is smaller than k={k}; it must be >= k")
        draws = limits.mc_samples if mc_samples is None else mc_samples
        if draws > limits.max_mc_samples:
            raise InvalidQueryError(
                f"mc_samples={draws} is above the limit {limits.max_mc_samples}"
            )
        chosen = metric or self.default_metric(gallery)
        if loaded is not None:
            self._check_metric(loaded, chosen, named=bool(metric))
        return SearchParams(
            k=k,
            metric=chosen,
            shortlist=shortlist or max(k, min(default_shortlist(k), limits.max_shortlist)),
            mc_samples=draws,
            temperature=temperature,
            reject_threshold=reject_threshold,
            return_embedding=return_embedding,
            filter=_parsed_filter(filter),
        )

    def _check_metric(self, loaded: LoadedIndex, metric: str, named: bool) -> None:
        """InvalidQueryError, saying why and listing available_metrics(loaded), unless the
        version serves `metric`."""
        accepted = self.available_metrics(loaded)
        if metric in accepted:
            return
        shown = metric if len(metric) <= 40 else metric[:40] + "..."
        what = f"metric {shown!r}" if named else f"the default metric {shown!r} (none was named)"
        where = f"the active {loaded.modality} version {loaded.version}"
        if metric in self._indexed_metrics(loaded):
            reason = (
                f"{what} is not calibrated in {where} (it has no rejection threshold, while "
                f"other metrics do): run `probsearch calibrate --gallery {loaded.modality} "
                f"--metrics {metric} --data ...` to serve it"
            )
        elif metric in METRICS or metric == MAX_PAIR:
            reason = f"{what} is not indexed by {where}"
            if metric == MAX_PAIR:
                reason += " (only a version built from a pvse model has its K-vector index)"
            else:
                reason += f" (reindex with --metrics including {metric} to serve it)"
        else:
            reason = f"unknown metric {shown!r}"
        raise InvalidQueryError(f"{reason}; served: {', '.join(accepted)}")

    def check_text(self, text: str) -> None:
        """A caption query must have a word and fit max_text_chars."""
        if not text.strip():
            raise InvalidQueryError("text is empty: send a caption with at least one word")
        if len(text) > self.settings.max_text_chars:
            raise InvalidQueryError(
                f"text has {len(text)} characters; the limit is {self.settings.max_text_chars} "
                "(max_text_chars)"
            )

    def search_batch(self, queries: Sequence[Query]) -> list["SearchResponse | Exception"]:
        """Answer every query; a failed query gets its exception in its slot. A query searches
        the version it was pinned to (Query.loaded), else the one its gallery serves now."""
        results: list[SearchResponse | Exception | None] = [None] * len(queries)
        encoded = self._encode_all(queries, results)
        same_version = _grouped(
            list(encoded), lambda p: (queries[p].gallery, id(queries[p].loaded))
        )
        for positions in same_version.values():
            try:
                with self._version_of(queries[positions[0]]) as loaded:
                    self._search_gallery(loaded, queries, encoded, positions, results)
            except IndexUnavailableError as error:
                for position in positions:
                    results[position] = error
        return [r if r is not None else RuntimeError("query was not answered") for r in results]

    def _version_of(self, query: Query) -> AbstractContextManager[LoadedIndex]:
        if query.loaded is not None:
            return nullcontext(query.loaded)
        return self.holder.acquire(query.gallery)

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
                groups[(encoder_kind(query), query.params.mc_samples)].append(position)
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
        if encoder is None and kind.startswith("vector-"):
            raise ValueError(
                "this model has no backbone whose vectors it could read: send mu and logvar"
            )
        if encoder is None:
            raise IndexUnavailableError(f"no {kind} encoder is loaded")
        mc_samples, seeds = queries[0].params.mc_samples, [q.seed for q in queries]
        start = time.perf_counter()
        if kind == "text":
            out = encoder.encode_texts([q.text or "" for q in queries], mc_samples, seeds)
        elif kind == "image":
            out = encoder.encode_images([q.image for q in queries], mc_samples, seeds)
        else:
            vectors = [q.features for q in queries]
            if len({len(v) for v in vectors}) > 1:  # type: ignore[arg-type]
                raise ValueError("backbone vectors of different widths cannot share a batch")
            out = encoder.encode_features(np.stack(vectors), mc_samples, seeds)  # type: ignore[arg-type]
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
                novelty=None if out.novelty is None else float(out.novelty[i]),
                words=self._word_check(queries[i]),
            )
            for i, position in enumerate(positions)
        }

    def _word_check(self, query: Query) -> WordCheck | None:
        if query.kind != "text" or self.known_words is None:
            return None
        return self.known_words.check(query.text or "")

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
        for (shortlist_metric, size, _), group in _grouped(
            plans, lambda p: (p.shortlist_metric, p.size, _filter_key(p))
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
        """Queries of one shortlist index, size and filter: one index call, then one
        models.scoring call per metric and draw count."""
        start = time.perf_counter()
        mu_q, logvar_q = _stacked(plans)  # (Q, D) each
        row_filter = plans[0].query.params.filter
        try:
            rows = loaded.index.shortlist(shortlist_metric, mu_q, logvar_q, size, row_filter)
            matched = None if row_filter is None else loaded.index.matching_count(row_filter)
        except LiveWriteError as refused:  # a filter on a version that cannot take one
            for plan in plans:
                results[plan.position] = InvalidQueryError(str(refused))
            return
        except UnsupportedMetricError:  # a query built below the edge (params checks requests)
            error = InvalidQueryError(
                f"metric {plans[0].metric!r} is not available in the {plans[0].query.gallery} "
                f"index {loaded.version} (its shortlist needs the {shortlist_metric!r} index); "
                f"served: {', '.join(self.available_metrics(loaded))}"
            )
            for plan in plans:
                results[plan.position] = error
            return
        shortlist_ms = _ms_since(start)
        same_scoring = _grouped(
            list(enumerate(plans)),
            lambda item: (
                item[1].metric,
                _draw_count(item[1].encoded),
                item[1].encoded.identical_draws,
            ),
        )
        for members in same_scoring.values():
            group = [plan for _, plan in members]
            outcomes = self._finish(
                loaded, group, rows[[i for i, _ in members]], shortlist_ms, matched
            )
            for plan, outcome in zip(group, outcomes, strict=True):
                results[plan.position] = outcome

    def shortlist_metric(self, metric: str) -> str:
        """The index a metric is shortlisted from: its own, or for metrics without an index
        form the candidate metric's (then re-ranked exactly)."""
        return metric if metric in INDEX_FAMILIES else self.settings.candidate_metric

    def available_metrics(self, loaded: LoadedIndex) -> list[str]:
        """The metrics a query may name against this loaded version: the one list that
        GET /v1/config, the page, the served OpenAPI schema and every refusal give.

        Those the version is indexed for (_indexed_metrics), less those without a rejection
        threshold when the version has calibrated any: an uncalibrated metric's answers would
        never be rejected while the others' are. A version with no calibration at all (a
        gallery reindexed from nothing, not yet calibrated) serves all its indexed metrics, and
        /readyz says that rejection is off. max_pair is not among the metrics calibrate takes,
        so it never counts as uncalibrated."""
        indexed = self._indexed_metrics(loaded)
        manifest = loaded.index.manifest
        uncalibrated = set(loaded.uncalibrated_metrics)
        if not set(manifest.metrics) - uncalibrated:  # nothing calibrated
            return indexed
        return [m for m in indexed if m not in uncalibrated]

    def _indexed_metrics(self, loaded: LoadedIndex) -> list[str]:
        """The metrics the version was built to serve (its manifest's `metrics`, which a
        reindex's --metrics decides) that it can shortlist, in METRICS order; then max_pair
        for a pvse version (its K-vector index)."""
        index = loaded.index
        listed = set(index.manifest.metrics)
        indexed = [m for m in METRICS if m in listed and index.supports(self.shortlist_metric(m))]
        if getattr(index, "multivector", None) is not None:
            indexed.append(MAX_PAIR)
        return indexed

    def _plan(self, loaded: LoadedIndex, position: int, query: Query, enc: Encoded) -> _Plan:
        """How the loaded version serves a query: the checks that need the version."""
        dim = loaded.index.manifest.dim
        if enc.mu.shape[-1] != dim:
            raise InvalidQueryError(
                f"the query embedding has {enc.mu.shape[-1]} dimensions but the {query.gallery} "
                f"index {loaded.version} holds {dim}-dimensional embeddings"
            )
        metric, size = query.params.metric, query.params.shortlist
        if metric == MAX_PAIR and query.params.filter is not None:
            raise InvalidQueryError(
                "a filter cannot be applied to max_pair (pvse's K-vector search); use another "
                f"metric: {', '.join(m for m in self.available_metrics(loaded) if m != MAX_PAIR)}"
            )
        if metric == MAX_PAIR:
            check_max_pair(loaded.index, query.gallery, enc.embeddings)
            return _Plan(position, query, enc, metric, MAX_PAIR, size)
        return _Plan(position, query, enc, metric, self.shortlist_metric(metric), size)

    def _finish(
        self,
        loaded: LoadedIndex,
        plans: list[_Plan],
        rows: np.ndarray,
        shortlist_ms: float,
        matched: int | None = None,
    ) -> list[SearchResponse]:
        """Re-rank, score and answer queries of one metric, shortlist size and draw count, with
        the one models.scoring call calibration makes too; `matched`: the items their filter
        matches."""
        settings = [_score_settings(loaded, plan) for plan in plans]
        temperatures = sorted({s.temperature for s in settings})
        captions = plans[0].query.gallery == "image"  # an image gallery is searched by text
        index = loaded.index
        scored = score_shortlists(
            plans[0].metric, _queries(plans), (index.mu, index.logvar), rows, plans[0].size,
            temperatures, captions, self.device,
        )  # fmt: skip
        found = [scored.query(q, s.temperature) for q, s in enumerate(settings)]
        ranked = scored.ranked
        timings = {"shortlist": shortlist_ms, **scored.timings_ms}
        posteriors, ks = [s.posterior[j] for s, j in found], [p.query.params.k for p in plans]
        hits = hit_lists(index, ranked, posteriors, ks, self._item_gate(loaded))
        outcomes = zip(plans, settings, found, ranked.counts, hits, strict=True)
        return [
            _outcome(
                loaded,
                plan,
                setting,
                scores,
                j,
                int(count),
                hit_list,
                timings,
                self.model_name,
                matched,
            )
            for plan, setting, (scores, j), count, hit_list in outcomes
        ]

    def _item_gate(self, loaded: LoadedIndex) -> ItemGate | None:
        """For results from the image gallery: the familiarity gate the loaded caption
        gallery's calibration sets for image queries, which marks the pictures it would
        refuse (models.scoring.item_familiarity); None for the caption gallery, or no gate."""
        if loaded.modality != "image":
            return None
        captions = next((c for c in self.holder.loaded() if c.modality == "text"), None)
        return captions.familiarity_gate if captions is not None else None

    def _finish_max_pair(self, loaded: LoadedIndex, plan: _Plan) -> SearchResponse:
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
        return _outcome(
            loaded, plan, setting, scores, 0, len(ranked.rows), hits, timings, self.model_name
        )


def _outcome(
    loaded: LoadedIndex,
    plan: _Plan,
    setting: ScoreSettings,
    scores: QueryScores,
    j: int,
    shortlist_size: int,
    hits: list[SearchHit],
    timings: dict[str, float],
    model: str,
    matched: int | None = None,
) -> SearchResponse:
    """The answer of the query at position j of `scores`."""
    params, enc = plan.query.params, plan.encoded
    embedding = (enc.mu, enc.logvar) if params.return_embedding else None
    query = query_info(
        plan.query.kind, scores, j, setting, params.mc_samples, shortlist_size, embedding,
        enc.words,
    )  # fmt: skip
    return SearchResponse(
        query=query,
        results=hits,
        metric=plan.metric,
        index_version=loaded.version,
        model=model,
        timings_ms=Timings(encode=enc.encode_ms, **timings),
        matched=matched,
    )


def _score_settings(loaded: LoadedIndex, plan: _Plan) -> ScoreSettings:
    params = plan.query.params
    calibration = loaded.index.manifest.calibration.get(plan.metric)
    return ScoreSettings.of(calibration, params.temperature, params.reject_threshold)


def _parsed_filter(spec: dict[str, Any] | None) -> MetadataFilter | None:
    if spec is None:
        return None
    try:
        return MetadataFilter.parse(spec)
    except FilterError as error:
        raise InvalidQueryError(f"filter: {error}") from None


def _filter_key(plan: _Plan) -> str | None:
    row_filter = plan.query.params.filter
    return None if row_filter is None else row_filter.cache_key()


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


def _queries(plans: Sequence[_Plan]) -> Embeddings:
    """The plans' queries and their MC draws (as many for each), stacked for models.scoring."""
    mu, logvar = _stacked(plans)
    encoded = [p.encoded for p in plans]
    mc_mu = mc_logvar = None
    if _draw_count(encoded[0]) > 0:
        mc_mu = np.stack([e.mc_mu for e in encoded], axis=1).astype(np.float32, copy=False)
        mc_logvar = np.stack([e.mc_logvar for e in encoded], axis=1).astype(np.float32, copy=False)
    identical = all(e.identical_draws for e in encoded)
    novelty = None
    if all(e.novelty is not None for e in encoded):
        novelty = np.array([e.novelty for e in encoded], dtype=np.float64)
    return Embeddings(mu, logvar, mc_mu, mc_logvar, identical_draws=identical, novelty=novelty)


def _version_key(query: Query) -> tuple[str, int]:
    """Queries searched against one version: their gallery's, pinned or current."""
    return query.gallery, id(query.loaded)


def _scoring_key(plan: _Plan) -> tuple[str, int, bool, bool]:
    """Queries scored by one models.scoring call share their metric, their draws (count and
    kind) and whether their encoder scored their novelty."""
    enc = plan.encoded
    return plan.metric, _draw_count(enc), enc.identical_draws, enc.novelty is not None


def encoder_kind(query: Query) -> str:
    """The encoder a query is embedded by: its kind's, or for a backbone vector the heads of
    the modality its gallery is searched by ("vector-text" for the image gallery)."""
    if query.kind != "vector":
        return query.kind
    return f"vector-{KIND_OF_GALLERY[query.gallery]}"


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
