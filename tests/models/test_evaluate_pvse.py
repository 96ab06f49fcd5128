"""`probsearch eval` of a pvse model ranks by max_pair (1 - best cosine of the K x K pairs):
checked against a brute-force loop over the pairs on a tiny trained model."""

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from typer.testing import CliRunner

from models.datasets.records import is_plausible_match, load_dataset
from models.datasets.shapes import generate_shapes
from models.evaluation.cli import app
from models.evaluation.evaluate import (
    DESCRIPTIVE_SCORES,
    EvalConfig,
    EvaluationError,
    SplitEmbeddings,
    _selection_accuracy,
    direction_scores,
    distance_chunks,
    embed_split,
    evaluate_model,
    is_single_object,
)
from models.networks.model_config import ModelConfig, TrainConfig
from models.onnx.encoder_runtime import Embeddings
from models.scoring.baseline_scores import BASELINE_NAMES
from models.scoring.uncertainty import mutual_information
from models.training.train import train
from tests.models.test_evaluate import brute_plausible, brute_recalls, loop_instability

K = 3
CONFIG = EvalConfig(metrics=("max_pair",), mc_samples=3, seed=0, shortlist_size=8, chunk_size=7)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("pvse-eval") / "shapes"
    return generate_shapes(out, 100, seed=3, progress=False, workers=1)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> Path:
    out = tmp_path_factory.mktemp("pvse-eval") / "pvse"
    config = ModelConfig(model_type="pvse", num_embeds=K, embed_dim=8)
    training = TrainConfig(epochs=2, patience=0, batch_size=16, seed=0)
    train(data_dir, out, config, training, progress=False, log=lambda line: None)
    return out


@pytest.fixture(scope="module")
def ood_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ood")
    rng = np.random.default_rng(0)
    for i in range(3):
        pixels = rng.integers(0, 256, (48, 48, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(out / f"noise{i}.png")
    return out


@pytest.fixture(scope="module")
def embedded(model_dir: Path, data_dir: Path) -> SplitEmbeddings:
    return embed_split(model_dir, load_dataset(data_dir, "test"), CONFIG)


@pytest.fixture(scope="module")
def report(model_dir: Path, data_dir: Path, ood_dir: Path, tmp_path_factory) -> dict:
    """Evaluated with the noise images as the OOD folder, and again as an extra folder of
    another name, which must be judged the same way."""
    extra = tmp_path_factory.mktemp("probes") / "more_noise"
    extra.mkdir()
    for png in ood_dir.glob("*.png"):
        (extra / png.name).write_bytes(png.read_bytes())
    config = dataclasses.replace(CONFIG, ood_dir=str(ood_dir), extra_ood_dirs=(str(extra),))
    return evaluate_model(model_dir, data_dir, "test", config)


def brute_max_pair(queries: np.ndarray, gallery: np.ndarray) -> np.ndarray:
    """1 - max over every (p, q) pair of <x_p, y_q>, by explicit loops: (Q, K, D) x (G, K, D)
    -> (Q, G) float64."""
    out = np.empty((len(queries), len(gallery)))
    for i, x in enumerate(queries.astype(np.float64)):
        for j, y in enumerate(gallery.astype(np.float64)):
            best = max(float(x[p] @ y[q]) for p in range(len(x)) for q in range(len(y)))
            out[i, j] = 1.0 - best
    return out


def test_eval_keeps_the_k_embeddings_of_every_item(embedded: SplitEmbeddings) -> None:
    images, captions = embedded.images, embedded.captions
    assert images.embeddings.shape == (len(embedded.dataset.images), K, 8)
    assert captions.embeddings.shape == (len(embedded.dataset.captions), K, 8)
    assert captions.mc_embeddings.shape == (3, len(embedded.dataset.captions), K, 8)


def test_distances_are_the_best_of_the_k_by_k_pairs(embedded: SplitEmbeddings) -> None:
    images, captions = embedded.images, embedded.captions
    chunks = distance_chunks("max_pair", captions, images, 7, torch.device("cpu"))
    got = np.concatenate([d.numpy() for _, d in chunks])  # (C, I)
    want = brute_max_pair(captions.embeddings, images.embeddings)
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_max_pair_needs_the_k_embeddings(embedded: SplitEmbeddings) -> None:
    gaussian = dataclasses.replace(embedded.images, embeddings=None, mc_embeddings=None)
    with pytest.raises(EvaluationError, match="pvse"):
        next(distance_chunks("max_pair", embedded.captions, gaussian, 7, torch.device("cpu")))


def test_retrieval_figures_match_a_loop_over_the_pairs(
    report: dict, embedded: SplitEmbeddings
) -> None:
    images, captions = embedded.images, embedded.captions
    t2i = brute_max_pair(captions.embeddings, images.embeddings)  # (C, I)
    i2t = brute_max_pair(images.embeddings, captions.embeddings)  # (I, C)
    own = embedded.caption_image[:, None] == np.arange(len(embedded.dataset.images))[None, :]
    plausible = np.array(
        [
            [is_plausible_match(c, im) for im in embedded.dataset.images]
            for c in embedded.dataset.captions
        ]
    )  # (C, I)
    for direction, d, positive, p in (
        ("t2i", t2i, own, plausible),
        ("i2t", i2t, own.T, plausible.T),
    ):
        retrieval = report["metrics"]["max_pair"][direction]["retrieval"]
        for k, value in brute_recalls(d, positive).items():
            assert retrieval[f"R@{k}"] == pytest.approx(value)
        top1, r_precision = brute_plausible(d, p)
        assert retrieval["P@1"] == pytest.approx(100 * top1.mean())
        assert retrieval["r_precision"] == pytest.approx(100 * np.nanmean(r_precision))
    single = [q for q, c in enumerate(embedded.dataset.captions) if is_single_object(c)]
    top1, _ = brute_plausible(t2i, plausible)
    t2i_retrieval = report["metrics"]["max_pair"]["t2i"]["retrieval"]
    assert t2i_retrieval["single_object_queries"] == len(single)
    if single:
        assert t2i_retrieval["P@1_single_object"] == pytest.approx(100 * top1[single].mean())
    by_text: dict[str, list[bool]] = {}
    for caption, hit in zip(embedded.dataset.captions, top1, strict=True):
        by_text.setdefault(caption.text, []).append(bool(hit))
    per_text = [np.mean(hits) for hits in by_text.values()]
    assert t2i_retrieval["distinct_text_queries"] == len(by_text)
    assert t2i_retrieval["P@1_distinct_texts"] == pytest.approx(100 * np.mean(per_text))


def test_scores_come_from_the_max_pair_distances_of_the_draws(embedded: SplitEmbeddings) -> None:
    queries, gallery = embedded.captions, embedded.images
    rng = np.random.default_rng(0)
    shortlist = np.stack([rng.permutation(len(gallery.mu))[:5] for _ in queries.mu])  # (C, 5)
    values = direction_scores("max_pair", queries, gallery, shortlist, CONFIG)
    for q in (0, len(queries.mu) // 2, len(queries.mu) - 1):
        candidates = gallery.embeddings[shortlist[q]]  # (5, K, D)
        draws = np.stack(
            [
                brute_max_pair(queries.mc_embeddings[draw, q : q + 1], candidates)
                for draw in range(3)
            ]
        )  # (L, 1, 5)
        for t in CONFIG.temperatures:
            expected = float(mutual_information(torch.from_numpy(draws), t)[0])
            assert values[f"mutual_information@T{t:g}"][q] == pytest.approx(expected, abs=1e-5)
        deterministic = brute_max_pair(queries.embeddings[q : q + 1], candidates)[0]  # (5,)
        ranked = sorted(deterministic.tolist())
        assert values["top1_distance"][q] == pytest.approx(ranked[0], abs=1e-5)
        assert values["top1_margin"][q] == pytest.approx(ranked[0] - ranked[1], abs=1e-5)
        low, high = loop_instability(deterministic.tolist(), draws[:, 0].tolist())
        assert low - 1e-12 <= values["top1_instability"][q] <= high + 1e-12
        p = np.exp(-deterministic / 0.1) / np.exp(-deterministic / 0.1).sum()
        want = -(p * np.log(p)).sum()
        # without draws the posterior entropy is that of the deterministic distances
        no_draws = dataclasses.replace(queries, mc_mu=None, mc_logvar=None, mc_embeddings=None)
        alone = direction_scores("max_pair", no_draws, gallery, shortlist, CONFIG)
        assert alone["posterior_entropy@T0.1"][q] == pytest.approx(want, abs=1e-5)
    spread = queries.logvar.astype(np.float64).sum(axis=1)  # log_det: the K vectors' spread
    assert values["log_det"] == pytest.approx(spread, rel=1e-5)


def test_report_has_every_figure_for_max_pair(report: dict) -> None:
    result = report["metrics"]["max_pair"]
    scores = {"log_det", "entropy", "feature_uncertainty", *BASELINE_NAMES, *DESCRIPTIVE_SCORES}
    scores -= {"top1_mean_distance"}  # max_pair reads no variance: its top-1 distance is that
    for t in CONFIG.temperatures:
        scores |= {f"mutual_information@T{t:g}", f"posterior_entropy@T{t:g}"}
    for direction in ("i2t", "t2i"):
        section = result[direction]
        assert {"pmrp", "pmrp_zeta0", "R@1_ceiling"} <= set(section["retrieval"])
        assert set(section["rejection"]) == scores | {"random", "oracle"}
        assert set(section["ambiguity_spearman"]) == scores
        assert section["rejection"]["random"]["auprc"] == pytest.approx(
            section["retrieval"]["P@1"] / 100
        )
    assert result["ood"]["images"] == 3 and set(result["ood"]["auroc"]) == scores
    assert set(result["ood"]["rejected"]) == scores
    assert all(0.0 <= share <= 1.0 for share in result["ood"]["rejected"].values())
    assert result["ood_extra"] == {"more_noise": result["ood"]}
    assert report["crop"]["tuples"] > 0
    assert set(report["crop"]["metrics"]) == {"max_pair"}


def test_crop_selection_uses_the_best_pair() -> None:
    def items(*vectors: list[list[float]]) -> Embeddings:
        k = np.array(vectors, dtype=np.float32)  # (P, K, 2)
        mean = k.mean(axis=1)
        return Embeddings(mu=mean, logvar=np.zeros_like(mean), embeddings=k)

    # One tuple (P = 1), K = 2, D = 2. Part A's query shares a vector with candidate 0 (best
    # pair 1 against 0.8), but the mean of its K vectors is closer to candidate 1's mean.
    query_a = items([[1.0, 0.0], [0.0, 1.0]])
    query_ab = items([[0.6, 0.8], [0.6, 0.8]])
    candidate_0 = items([[1.0, 0.0], [-1.0, 0.0]])
    candidate_1 = items([[0.6, 0.8], [0.8, 0.6]])
    accuracy = _selection_accuracy("max_pair", (query_a, query_ab), (candidate_0, candidate_1))
    assert accuracy == {"part_a": 100.0, "union": 100.0, "overall": 100.0}
    by_mean = _selection_accuracy("w2", (query_a, query_ab), (candidate_0, candidate_1))
    assert by_mean["part_a"] == 0.0


def test_cli_evaluates_a_pvse_model_by_max_pair(model_dir: Path, data_dir: Path) -> None:
    runner = CliRunner()
    base = ["eval", "--data", str(data_dir), "--mc-samples", "0", "--shortlist", "5"]
    result = runner.invoke(app, [*base, "--model", str(model_dir)])
    assert result.exit_code == 0, result.output
    assert "max_pair" in result.output
    result = runner.invoke(app, [*base, "--model", str(model_dir), "--metrics", "maxpair"])
    assert result.exit_code == 2 and "max_pair" in result.output
