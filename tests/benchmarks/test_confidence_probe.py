"""benchmarks/confidence_probe.py's two formulas: the true-match probability against a loop
over softmaxes, and the ridge predictor against a target it can represent exactly."""

import math

import numpy as np
import pytest

from benchmarks.confidence_probe import ridge_predictor, true_match_probability


def test_true_match_probability_is_the_softmax_mass_on_the_plausible_items() -> None:
    rng = np.random.default_rng(0)
    queries = rng.normal(size=(5, 4))
    gallery = rng.normal(size=(7, 4))
    plausible = rng.random((5, 7)) < 0.4
    got = true_match_probability(queries, gallery, plausible, temperature=0.5)
    for q in range(5):
        logits = [float(queries[q] @ gallery[g]) / 0.5 for g in range(7)]
        total = sum(math.exp(v) for v in logits)
        want = sum(math.exp(v) for v, p in zip(logits, plausible[q], strict=True) if p) / total
        assert got[q] == pytest.approx(want, rel=1e-9)


def test_the_ridge_predictor_recovers_a_target_in_its_components() -> None:
    rng = np.random.default_rng(1)
    latent = rng.normal(size=(400, 3))
    features = latent @ rng.normal(size=(3, 20)) + 1e-3 * rng.normal(size=(400, 20))
    target = latent @ np.array([1.0, -2.0, 0.5]) + 3.0
    predict = ridge_predictor(features, target, components=3, ridge=1e-6)
    fresh = rng.normal(size=(50, 3))
    new_features = fresh @ np.linalg.lstsq(latent, features, rcond=None)[0]
    np.testing.assert_allclose(predict(new_features), fresh @ np.array([1.0, -2.0, 0.5]) + 3.0,
                               atol=0.05)  # fmt: skip
