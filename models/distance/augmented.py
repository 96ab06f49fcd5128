"""Metric-native index forms (DESIGN section 3): augmented vectors that FAISS searches exactly.

Each family turns a Gaussian distance into a squared L2 distance ("l2") or an inner product
("ip") between an augmented gallery vector and an augmented query vector, plus a per-query
constant:

    l2 family:  distance = ||query_vector - gallery_vector||^2 + const
    ip family:  distance = const - <query_vector, gallery_vector>

Query vectors of the ip families are negated, so FAISS's largest inner product is the smallest
distance. The vectors are built in float64 and handed to FAISS as C-contiguous float32.
"""

from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from models.distance.gaussian import check_metric

INDEX_FAMILIES: dict[str, str | tuple[str, ...]] = {
    "w2": "w2",
    "csd": "csd",
    "kl": "kl",
    "kl_reverse": "kl_reverse",
    "js": "js",
    "mahalanobis": "mahalanobis",
    "query_mahalanobis": "query_mahalanobis",
    # top-k(min_kl) lies inside top-k(kl) ∪ top-k(kl_reverse): an item whose min_kl is its KL
    # is beaten in min_kl by every item that beats it in KL.
    "min_kl": ("kl", "kl_reverse"),
}
FAMILIES: tuple[str, ...] = (
    "w2",
    "csd",
    "kl",
    "kl_reverse",
    "js",
    "mahalanobis",
    "query_mahalanobis",
)


class UnknownFamilyError(ValueError):
    """An index family name outside FAMILIES."""


@dataclass(frozen=True)
class IndexForm:
    """How one family is searched: its name and the FAISS metric ("l2" or "ip")."""

    family: str
    faiss_metric: Literal["l2", "ip"]


_FORMS = {
    "w2": IndexForm("w2", "l2"),
    "csd": IndexForm("csd", "l2"),
    "kl": IndexForm("kl", "ip"),
    "kl_reverse": IndexForm("kl_reverse", "ip"),
    "js": IndexForm("js", "ip"),
    "mahalanobis": IndexForm("mahalanobis", "ip"),
    "query_mahalanobis": IndexForm("query_mahalanobis", "ip"),
}


def index_form(family: str) -> IndexForm:
    """The IndexForm of `family`; UnknownFamilyError for a name outside FAMILIES."""
    if family not in _FORMS:
        raise UnknownFamilyError(
            f"unknown index family {family!r}; choose one of {', '.join(FAMILIES)}"
        )
    return _FORMS[family]


def candidate_families(metric: str, fallback: str = "w2") -> tuple[str, ...]:
    """Index families whose shortlists (their union) serve `metric`.

    Exact for the metrics in INDEX_FAMILIES; bhattacharyya, elk and match_prob have no index
    form and are re-ranked from the shortlist of the `fallback` family.
    """
    check_metric(metric)
    index_form(fallback)
    families = INDEX_FAMILIES.get(metric, fallback)
    return families if isinstance(families, tuple) else (families,)


def augmented_dim(family: str, dim: int) -> int:
    """Length of the augmented vectors of `family` for embeddings of dimension `dim`."""
    index_form(family)
    return {
        "w2": 2 * dim,
        "csd": dim + 1,
        "kl": 2 * dim + 1,
        "kl_reverse": 2 * dim + 1,
        "js": 4 * dim + 2,
        "mahalanobis": 2 * dim + 1,
        "query_mahalanobis": 2 * dim,
    }[family]


def gallery_vectors(family: str, mu, logvar) -> np.ndarray:
    """Augmented gallery vectors (N, augmented_dim) float32 from mu, logvar (N, D)."""
    index_form(family)
    mu, logvar = _as_float64(mu, "mu"), _as_float64(logvar, "logvar")
    _check_pair(mu, logvar)
    return _to_faiss(_GALLERY[family](mu, logvar))


def query_vectors(family: str, mu, logvar) -> tuple[np.ndarray, np.ndarray]:
    """Augmented query vectors (Q, augmented_dim) float32 and per-query constants (Q,) float64.

    `logvar` may be None for "mahalanobis" (a point query).
    """
    index_form(family)
    mu = _as_float64(mu, "mu")
    if logvar is None:
        if family != "mahalanobis":
            raise ValueError(f"family {family!r} needs the query logvar; only mahalanobis does not")
        logvar = np.zeros_like(mu)
    logvar = _as_float64(logvar, "logvar")
    _check_pair(mu, logvar)
    vectors, const = _QUERY[family](mu, logvar)
    return _to_faiss(vectors), const


def scores_to_distances(family: str, scores, const) -> np.ndarray:
    """Exact distances (Q, k) float32 from FAISS scores (Q, k) and the query constants (Q,).

    Entries FAISS pads (no result: +-FLT_MAX or +-inf) become +inf.
    """
    form = index_form(family)
    scores = np.asarray(scores, dtype=np.float64)  # (Q, k)
    const = np.asarray(const, dtype=np.float64)  # (Q,)
    if scores.ndim != 2 or const.shape != (scores.shape[0],):
        raise ValueError(
            f"scores must be (Q, k) and const (Q,); got {scores.shape} and {const.shape}"
        )
    is_l2 = form.faiss_metric == "l2"
    distances = scores + const[:, None] if is_l2 else const[:, None] - scores
    padded = ~(np.abs(scores) < np.finfo(np.float32).max)
    distances[padded] = np.inf
    return distances.astype(np.float32)


# ---- the forms, float64 (N, D) in, float64 out ------------------------------------------------


def _w2_gallery(mu: np.ndarray, logvar: np.ndarray) -> np.ndarray:
    return np.concatenate([mu, np.exp(0.5 * logvar)], axis=1)  # (N, 2D)


def _w2_query(mu: np.ndarray, logvar: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return _w2_gallery(mu, logvar), np.zeros(mu.shape[0])


def _csd_gallery(mu: np.ndarray, logvar: np.ndarray) -> np.ndarray:
    trace = np.exp(logvar).sum(axis=1, keepdims=True)  # (N, 1)
    return np.concatenate([mu, np.sqrt(trace)], axis=1)  # (N, D + 1)


def _csd_query(mu: np.ndarray, logvar: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    vectors = np.concatenate([mu, np.zeros((mu.shape[0], 1))], axis=1)  # (Q, D + 1)
    return vectors, np.exp(logvar).sum(axis=1)


def _kl_gallery(mu: np.ndarray, logvar: np.ndarray) -> np.ndarray:
    # KL(q||g) = 1/2 [(var_q + mu_q^2)·prec_g - 2 mu_q·(mu_g prec_g) + c_g - D - sum ln var_q]
    prec = np.exp(-logvar)
    c_g = (mu**2 * prec + logvar).sum(axis=1, keepdims=True)  # (N, 1)
    return np.concatenate([prec, mu * prec, c_g], axis=1)  # (N, 2D + 1)


def _kl_query(mu: np.ndarray, logvar: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    ones = np.ones((mu.shape[0], 1))
    vectors = np.concatenate([-0.5 * (np.exp(logvar) + mu**2), mu, -0.5 * ones], axis=1)
    const = -0.5 * (mu.shape[1] + logvar.sum(axis=1))
    return vectors, const  # (Q, 2D + 1), (Q,)


def _kl_reverse_gallery(mu: np.ndarray, logvar: np.ndarray) -> np.ndarray:
    # KL(g||q) = 1/2 [(var_g + mu_g^2)·prec_q - 2 mu_g·(mu_q prec_q) - sum ln var_g
    #                 + sum(mu_q^2 prec_q + ln var_q) - D]
    log_det = logvar.sum(axis=1, keepdims=True)  # (N, 1)
    return np.concatenate([np.exp(logvar) + mu**2, mu, log_det], axis=1)  # (N, 2D + 1)


def _kl_reverse_query(mu: np.ndarray, logvar: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    prec = np.exp(-logvar)
    ones = np.ones((mu.shape[0], 1))
    vectors = np.concatenate([-0.5 * prec, mu * prec, 0.5 * ones], axis=1)
    const = 0.5 * ((mu**2 * prec + logvar).sum(axis=1) - mu.shape[1])
    return vectors, const  # (Q, 2D + 1), (Q,)


def _js_gallery(mu: np.ndarray, logvar: np.ndarray) -> np.ndarray:
    return np.concatenate([_kl_gallery(mu, logvar), _kl_reverse_gallery(mu, logvar)], axis=1)


def _js_query(mu: np.ndarray, logvar: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    # JS = (KL + KL_reverse) / 2: half of each query vector, half of the sum of the constants.
    forward, const_forward = _kl_query(mu, logvar)
    reverse, const_reverse = _kl_reverse_query(mu, logvar)
    vectors = 0.5 * np.concatenate([forward, reverse], axis=1)  # (Q, 4D + 2)
    return vectors, 0.5 * (const_forward + const_reverse)


def _mahalanobis_gallery(mu: np.ndarray, logvar: np.ndarray) -> np.ndarray:
    # sum (mu_q - mu_g)^2 prec_g = mu_q^2·prec_g - 2 mu_q·(mu_g prec_g) + sum mu_g^2 prec_g
    prec = np.exp(-logvar)
    c_g = (mu**2 * prec).sum(axis=1, keepdims=True)  # (N, 1)
    return np.concatenate([prec, mu * prec, c_g], axis=1)  # (N, 2D + 1)


def _mahalanobis_query(mu: np.ndarray, logvar: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    del logvar  # a point query
    ones = np.ones((mu.shape[0], 1))
    return np.concatenate([-(mu**2), 2.0 * mu, -ones], axis=1), np.zeros(mu.shape[0])


def _query_mahalanobis_gallery(mu: np.ndarray, logvar: np.ndarray) -> np.ndarray:
    # sum (mu_g - mu_q)^2 prec_q = mu_g^2·prec_q - 2 mu_g·(mu_q prec_q) + sum mu_q^2 prec_q
    del logvar  # the gallery's variances do not enter
    return np.concatenate([mu**2, mu], axis=1)  # (N, 2D)


def _query_mahalanobis_query(mu: np.ndarray, logvar: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    prec = np.exp(-logvar)
    vectors = np.concatenate([-prec, 2.0 * mu * prec], axis=1)  # (Q, 2D)
    return vectors, (mu**2 * prec).sum(axis=1)


_GALLERY = {
    "w2": _w2_gallery,
    "csd": _csd_gallery,
    "kl": _kl_gallery,
    "kl_reverse": _kl_reverse_gallery,
    "js": _js_gallery,
    "mahalanobis": _mahalanobis_gallery,
    "query_mahalanobis": _query_mahalanobis_gallery,
}
_QUERY = {
    "w2": _w2_query,
    "csd": _csd_query,
    "kl": _kl_query,
    "kl_reverse": _kl_reverse_query,
    "js": _js_query,
    "mahalanobis": _mahalanobis_query,
    "query_mahalanobis": _query_mahalanobis_query,
}


def _as_float64(array, name: str) -> np.ndarray:
    if isinstance(array, torch.Tensor):
        array = array.detach().to(device="cpu", dtype=torch.float64).numpy()
    array = np.asarray(array, dtype=np.float64)
    if array.ndim != 2:
        raise ValueError(f"{name} must be 2-D (N, D); got shape {array.shape}")
    return array


def _check_pair(mu: np.ndarray, logvar: np.ndarray) -> None:
    if mu.shape != logvar.shape:
        raise ValueError(f"mu and logvar shapes differ: {mu.shape} vs {logvar.shape}")


def _to_faiss(vectors: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(vectors, dtype=np.float32)
