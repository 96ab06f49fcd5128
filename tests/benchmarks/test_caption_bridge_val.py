"""benchmarks/caption_bridge_val.py: the bridge vector against a loop over the training
drawings, and P@1 against counting by hand."""

import sys
from pathlib import Path

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from caption_bridge_val import Bridge, precision_at_1


def _bridge_by_loop(drawings, words, query, k, temperature):
    centre = drawings.mean(0)
    unit = lambda v: v / np.linalg.norm(v)  # noqa: E731
    cosines = [float(unit(query - centre) @ unit(d - centre)) for d in drawings]
    nearest = sorted(range(len(drawings)), key=lambda i: -cosines[i])[:k]
    weights = np.exp([cosines[i] / temperature for i in nearest])
    weights /= weights.sum()
    return unit(sum(w * words[i] for w, i in zip(weights, nearest, strict=True)))


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10**6), k=st.integers(1, 6), temperature=st.sampled_from([0.05, 1.0]))
def test_the_bridge_is_the_weighted_mean_of_the_nearest_drawings_words(seed, k, temperature):
    rng = np.random.default_rng(seed)
    drawings, words = rng.normal(size=(8, 5)), rng.normal(size=(8, 3))
    query = rng.normal(size=5)
    bridge = Bridge(torch.tensor(drawings, dtype=torch.float64), torch.tensor(words))
    got = bridge.of(torch.tensor(query[None]), k, temperature)[0].numpy()
    np.testing.assert_allclose(got, _bridge_by_loop(drawings, words, query, k, temperature),
                               atol=1e-9)  # fmt: skip


def test_precision_at_1_counts_plausible_first_answers_in_both_directions():
    similarity = torch.tensor([[0.9, 0.1, 0.0], [0.2, 0.8, 0.1]])  # 2 captions x 3 drawings
    plausible = np.array([[True, False, False], [False, False, True]])
    # captions' first answers: drawing 0 (right), drawing 1 (wrong): t2i 50%;
    # drawings' first answers: caption 0 (right), caption 1 (wrong), caption 1 (right): 66.7%
    t2i, i2t = precision_at_1(similarity, plausible)
    assert t2i == 50.0
    assert abs(i2t - 200 / 3) < 1e-9
