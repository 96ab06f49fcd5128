"""A search's answer, declared once: these dataclasses are the JSON body of every search
endpoint (service.http.search_flow writes them as they are) and the OpenAPI schema of its
response (FastAPI reads the same classes), so the two cannot drift apart.

Distances and scores, once for the whole API:
- `distance` is the exact distance of the requested metric between the query's Gaussian and
  the result's Gaussian (models.distance.gaussian; smaller is closer; results are sorted by it).
- `score` is the retrieval posterior of the result: softmax(-distance / T) over the whole
  shortlist, with T the temperature in force (`query.temperature`). It lies in [0, 1], larger
  is better, and the scores of all shortlist candidates sum to 1, so the scores of the
  returned top-k sum to at most 1.
"""

import math
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import ConfigDict, Field, TypeAdapter

from indexer.manifest import Calibration
from models.scoring.gallery_range import OUT_OF_RANGE_SCORE, RANGE_LIMIT
from models.scoring.item_familiarity import ItemGate
from models.scoring.known_words import UNKNOWN_WORDS_LIMIT, UNKNOWN_WORDS_SCORE, WordCheck
from models.scoring.query_scores import QueryScores, unfamiliar
from models.scoring.rerank import RankedBatch
from models.scoring.uncertainty import log_det

QueryKind = Literal["text", "image", "embedding", "vector"]  # vector: a backbone vector
DEFAULT_TEMPERATURE = 1.0
DEFAULT_REJECT_SCORE = "mutual_information"  # of a version that was never calibrated
UNIFORM_NATS = 0.01  # a posterior this close to uniform ranks nothing above anything else
SAME_DRAWS = 1e-12  # variance of mu across MC draws at or below which the draws are one
# NaN and infinities are written as null, as pydantic writes them
_JSON = ConfigDict(ser_json_inf_nan="null")


def _about(text: str, **constraints: Any) -> Any:
    return Field(description=text, **constraints)


@dataclass
class SearchHit:
    """One result; see the module docstring for `distance` and `score`."""

    __pydantic_config__ = _JSON

    id: str
    rank: Annotated[int, Field(ge=1)]
    score: float
    distance: float
    log_det: Annotated[float, _about("sum of ln sigma^2 of the result.")]
    metadata: dict[str, Any]
    unfamiliar: Annotated[
        bool | None,
        _about("Pictures only: whether the familiarity gate that refuses image queries "
               "(the caption gallery's calibration) would refuse this picture, unlike "
               "anything the model was trained on, so its distance means little; null when "
               "there is no gate or the picture's score for it was not stored."),
    ] = None  # fmt: skip


@dataclass
class RejectScore:
    """The uncertainty score the service rejects with, chosen per metric by calibration; the
    familiarity gate's score (novelty or log_det) with its limit when an image query is above
    it (an unfamiliar image)."""

    __pydantic_config__ = _JSON

    name: Annotated[
        str,
        _about("One of log_det, entropy, feature_uncertainty, mutual_information, "
               "posterior_entropy, top_mahalanobis, novelty, unknown_words (the share of "
               "the caption's content words the model never met in training), out_of_range "
               "(how far the query lies from the gallery, in gallery radii)."),
    ]  # fmt: skip
    value: Annotated[float | None, _about("The query's value; null if not computed "
                                          "(a draw-based score with mc_samples 0).")]  # fmt: skip
    threshold: Annotated[float | None, _about("Rejected when value > threshold; null: never.")]

    @property
    def rejected(self) -> bool:
        return self.value is not None and self.threshold is not None and self.value > self.threshold


@dataclass
class QueryInfo:
    """What the service knows about the query itself."""

    __pydantic_config__ = _JSON

    modality: QueryKind
    log_det: Annotated[float, _about("sum of ln sigma^2 of the query (larger: vaguer).")]
    entropy: Annotated[float, _about("Differential entropy of the query Gaussian (nats).")]
    mutual_information: Annotated[
        float | None,
        _about("Posterior uncertainty over the shortlist in nats, in [0, ln(shortlist)]; "
               "null when mc_samples is 0; in `uninformative` when the draws were all the "
               "same (then always 0)."),
    ]  # fmt: skip
    feature_uncertainty: Annotated[
        float | None,
        _about("Sum over dims of the variance of mu across MC draws; null if mc_samples=0."),
    ]
    posterior_entropy: Annotated[
        float,
        _about("Entropy (nats) of the mean retrieval posterior over the shortlist: high "
               "when many candidates are about equally good (an ambiguous query); in "
               "`uninformative` when it is ln(shortlist_size), a uniform posterior."),
    ]  # fmt: skip
    top_mahalanobis: Annotated[
        float | None,
        _about("Squared Mahalanobis distance between the image and caption means of the "
               "query and its first result, under the caption's Gaussian (whose variance is "
               "the spread of the images it describes): large when the first result lies "
               "outside what the caption allows. Null for models without variances (pvse)."),
    ]  # fmt: skip
    novelty: Annotated[
        float | None,
        _about("Image queries of a model on pretrained backbones: the cosine distance from the "
               "image's backbone vector to the nearest training image's (0: seen in training; "
               "large: unlike anything the model was trained on). Null otherwise."),
    ]  # fmt: skip
    reject_score: RejectScore
    rejected: Annotated[bool, _about("reject_score.value > reject_score.threshold.")]
    reject_threshold: Annotated[
        float | None, _about("Same as reject_score.threshold; null: never rejects.")
    ]
    temperature: float
    mc_samples: int
    shortlist_size: Annotated[int, _about("Candidates actually re-ranked.")]
    mu: list[float] | None = None
    logvar: list[float] | None = None
    uninformative: Annotated[
        list[str],
        _about("Names of this query's scores that carry no information, to be ignored: "
               "posterior_entropy when the posterior is uniform over the shortlist (within "
               f"{UNIFORM_NATS:g} nats of ln(shortlist_size), or a shortlist of one); "
               "mutual_information and feature_uncertainty when the MC draws were all the same "
               "(a model without dropout, or one draw), where both are 0 whatever the query. "
               "Their values are still given."),
    ] = field(default_factory=list)  # fmt: skip
    unknown_words: Annotated[
        list[str],
        _about("Caption queries: the content words the model never met in its training "
               "captions (its encoders cannot place them). A caption with more unknown than "
               "known content words is rejected by the unknown_words score."),
    ] = field(default_factory=list)  # fmt: skip
    did_you_mean: Annotated[
        str | None,
        _about("Caption queries with unknown words: the caption's words with each unknown "
               "word that is one edit (a letter dropped, two swapped, one changed or one added) "
               "from a word the model knows replaced by it, e.g. \"red circle\" for \"redd "
               "circel\". Null when no unknown word is that close to a known one."),
    ] = None  # fmt: skip
    out_of_range: Annotated[
        float | None,
        _about("Distance of the query's mean from the centre of the gallery's means, in "
               "gallery radii (at most 1 for an item of the gallery). Above "
               f"{RANGE_LIMIT:g} every item is within 10% of the same distance, the ranking "
               "means nothing and the other scores look falsely certain: the query is "
               "rejected by this score. Null for pvse (max_pair) queries."),
    ] = None  # fmt: skip


@dataclass
class Timings:
    """Milliseconds per stage; batch stages are shared by the requests batched together."""

    __pydantic_config__ = _JSON

    encode: float
    shortlist: float
    rerank: float
    uncertainty: float
    total: float = 0.0  # set when the answer is written


@dataclass
class SearchResponse:
    """The answer of every search endpoint."""

    __pydantic_config__ = _JSON

    query: QueryInfo
    results: list[SearchHit]
    metric: str
    index_version: str
    model: str
    timings_ms: Timings
    matched: int | None = None  # items the request's filter matched; None: no filter


_RESPONSE = TypeAdapter(SearchResponse)


def response_json(response: SearchResponse) -> bytes:
    """The JSON body of `response`."""
    return _RESPONSE.dump_json(response)


def parse_response(body: bytes | str) -> SearchResponse:
    """A body parsed and validated against the declaration (what clients and tests may do)."""
    return _RESPONSE.validate_json(body)


def query_info(
    kind: QueryKind,
    scores: QueryScores,
    j: int,
    rule: "ScoreSettings",
    mc_samples: int,
    shortlist_size: int,
    embedding: tuple[np.ndarray, np.ndarray] | None,
    words: WordCheck | None = None,
) -> QueryInfo:
    """The query at position j of `scores`, judged by `rule`; `embedding`: its (mu, logvar)
    when the request asked for them; `words`: a caption's unknown words."""
    values = {name: _value(scores.get(name), j) for name in _SCORE_FIELDS}
    far = _value(scores.out_of_range, j)
    reject = rule.reject_score(values, words, far)
    mu, logvar = (None, None) if embedding is None else (a.tolist() for a in embedding)
    return QueryInfo(
        modality=kind, **values, reject_score=reject, rejected=reject.rejected,
        reject_threshold=reject.threshold, temperature=rule.temperature, mc_samples=mc_samples,
        shortlist_size=shortlist_size, mu=mu, logvar=logvar,
        uninformative=uninformative(values, mc_samples, shortlist_size),
        unknown_words=list(words.unknown) if words is not None else [],
        did_you_mean=words.suggestion if words is not None else None, out_of_range=far,
    )  # fmt: skip


def uninformative(
    values: dict[str, float | None], mc_samples: int, shortlist_size: int
) -> list[str]:
    """The scores among `values` that say nothing about this query (QueryInfo.uninformative).
    ln(n) - H(p) is the KL divergence of the posterior p from the uniform one over n."""
    found = []
    entropy = values.get("posterior_entropy")
    if entropy is not None and (
        shortlist_size <= 1 or math.log(shortlist_size) - entropy < UNIFORM_NATS
    ):
        found.append("posterior_entropy")
    spread = values.get("feature_uncertainty")
    if values.get("mutual_information") is not None and (
        mc_samples < 2 or (spread is not None and spread <= SAME_DRAWS)
    ):
        found += ["mutual_information", "feature_uncertainty"]
    return found


_SCORE_FIELDS = ("log_det", "entropy", "mutual_information", "feature_uncertainty",
                 "posterior_entropy", "top_mahalanobis", "novelty")  # fmt: skip


def _value(values: np.ndarray | None, j: int) -> float | None:
    return None if values is None else float(values[j])


@dataclass(frozen=True)
class ScoreSettings:
    """A query's temperature and rejection rule: its request's, else its metric's calibration."""

    temperature: float
    threshold: float | None
    score_name: str
    gate_score: str = "log_det"  # what the calibration's familiarity gate reads
    gate_limit: float | None = None  # its limit (None: no gate)

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
            calibration.gate_score,
            calibration.gate_limit if threshold is None else None,
        )

    def reject_score(
        self,
        values: dict[str, float | None],
        words: WordCheck | None = None,
        out_of_range: float | None = None,
    ) -> RejectScore:
        """The score that decides, from the query's score values by name: the share of
        unknown words of a caption that is mostly unknown words, else out_of_range when the
        query lies beyond RANGE_LIMIT outside the gallery (whatever the request's threshold:
        like unknown words, no calibration makes such a query answerable), else the
        familiarity gate's score when it is above the gate (an image unlike the training
        images), else the calibrated score."""
        if words is not None and words.mostly_unknown:
            return RejectScore(UNKNOWN_WORDS_SCORE, words.unknown_fraction, UNKNOWN_WORDS_LIMIT)
        if out_of_range is not None and out_of_range > RANGE_LIMIT:
            return RejectScore(OUT_OF_RANGE_SCORE, out_of_range, RANGE_LIMIT)
        familiarity = values.get(self.gate_score)
        if familiarity is not None and unfamiliar(familiarity, self.gate_limit):
            return RejectScore(self.gate_score, familiarity, self.gate_limit)
        return RejectScore(self.score_name, values.get(self.score_name), self.threshold)


def hit_lists(
    index: Any,
    ranked: RankedBatch,
    posteriors: list[np.ndarray],
    ks: list[int],
    gate: ItemGate | None = None,
) -> list[list[SearchHit]]:
    """Each query's top k results; one metadata lookup and one copy of the numbers for all.
    `gate`: the familiarity gate that marks the pictures it would refuse."""
    tops = np.minimum(np.asarray(ks), ranked.counts)  # (Q,)
    width = int(tops.max()) if len(tops) else 0
    distances = ranked.distances[:, :width].cpu().numpy().tolist()  # (Q, width)
    log_dets = log_det(ranked.logvar[:, :width]).cpu().numpy()  # (Q, width)
    rows = np.concatenate([ranked.rows[q, :top] for q, top in enumerate(tops)])
    records = iter(index.metadata(rows.tolist()))
    flags = iter(_unfamiliar(index, gate, rows, log_dets, tops))
    hits = []
    for q, top in enumerate(tops.tolist()):
        scores, dets = posteriors[q][:top].tolist(), log_dets[q].tolist()
        hits.append(
            [_hit(next(records), r, scores[r], distances[q][r], dets[r], next(flags))
             for r in range(top)]
        )  # fmt: skip
    return hits


def _unfamiliar(
    index: Any, gate: ItemGate | None, rows: np.ndarray, log_dets: np.ndarray, tops: np.ndarray
) -> list[bool | None]:
    """Per result row (in `rows` order): past the gate or not; None without a verdict."""
    if gate is not None:
        dets = np.concatenate([log_dets[q, :top] for q, top in enumerate(tops)])
        novelty = None if index.novelty is None else np.asarray(index.novelty[rows])
        flags = gate.flags(dets, novelty)
        if flags is not None:
            return flags.tolist()
    return [None] * len(rows)


def _hit(
    record: dict[str, Any],
    r: int,
    score: float,
    distance: float,
    log_det: float,
    unfamiliar: bool | None,
) -> SearchHit:
    meta = dict(record)
    item_id = str(meta.pop("id"))
    return SearchHit(item_id, r + 1, score, distance, log_det, meta, unfamiliar)
