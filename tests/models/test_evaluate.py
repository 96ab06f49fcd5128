"""`probsearch eval` end to end on the tiny shapes model, checked against direct computation."""

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from scipy.stats import spearmanr
from typer.testing import CliRunner

from models.datasets.records import is_plausible_match, load_dataset
from models.distance.gaussian import pairwise_distance
from models.evaluation.cli import app
from models.evaluation.evaluate import (
    DESCRIPTIVE_SCORES,
    NO_MATCH_REMOVED,
    EvalConfig,
    PlausibleMatchRelevance,
    SplitEmbeddings,
    _selection_accuracy,
    direction_scores,
    embed_split,
    evaluate_direction,
    evaluate_model,
    rejected_share,
)
from models.evaluation.report import markdown_report, write_report
from models.onnx.encoder_runtime import Embeddings
from models.scoring.baseline_scores import BASELINE_NAMES
from models.scoring.uncertainty import mutual_information

CONFIG = EvalConfig(metrics=("w2", "kl"), mc_samples=3, seed=0, shortlist_size=20)


@pytest.fixture(scope="module")
def report(tiny_model_dir: Path, shapes_dir: Path) -> dict:
    return evaluate_model(tiny_model_dir, shapes_dir, "test", CONFIG)


@pytest.fixture(scope="module")
def embedded(tiny_model_dir: Path, shapes_dir: Path) -> SplitEmbeddings:
    return embed_split(tiny_model_dir, load_dataset(shapes_dir, "test"), CONFIG)


def brute_recalls(distances: np.ndarray, positive: np.ndarray) -> dict[int, float]:
    """R@K by an explicit loop over each query's sorted gallery (on a tie, e.g. two captions
    with the same text, the non-matching item comes first)."""
    hits = {1: 0, 5: 0, 10: 0}
    for q in range(distances.shape[0]):
        order = np.lexsort((positive[q], distances[q]))
        first = next(i for i, g in enumerate(order) if positive[q, g])
        for k in hits:
            hits[k] += first < k
    return {k: 100.0 * v / distances.shape[0] for k, v in hits.items()}


def test_recalls_match_a_direct_computation(report: dict, embedded: SplitEmbeddings) -> None:
    images, captions = embedded.images, embedded.captions
    tensors = [
        torch.from_numpy(a) for a in (images.mu, images.logvar, captions.mu, captions.logvar)
    ]
    for metric in CONFIG.metrics:
        i2t = pairwise_distance(metric, *tensors).numpy()  # (I, C)
        t2i = pairwise_distance(metric, *tensors[2:], *tensors[:2]).numpy()  # (C, I)
        owner = embedded.caption_image
        expected_i2t = brute_recalls(i2t, np.arange(i2t.shape[0])[:, None] == owner[None, :])
        expected_t2i = brute_recalls(t2i, owner[:, None] == np.arange(t2i.shape[1])[None, :])
        for k in (1, 5, 10):
            assert report["metrics"][metric]["i2t"]["retrieval"][f"R@{k}"] == pytest.approx(
                expected_i2t[k]
            )
            assert report["metrics"][metric]["t2i"]["retrieval"][f"R@{k}"] == pytest.approx(
                expected_t2i[k]
            )


def test_report_is_consistent(report: dict, embedded: SplitEmbeddings) -> None:
    assert report["data"]["images"] == len(embedded.dataset.images) > 0
    for result in report["metrics"].values():
        assert result["rsum"] == pytest.approx(
            result["i2t"]["retrieval"]["rsum"] + result["t2i"]["retrieval"]["rsum"]
        )
        for direction in ("i2t", "t2i"):
            retrieval, rejection = result[direction]["retrieval"], result[direction]["rejection"]
            assert 0 <= retrieval["R@1"] <= retrieval["R@5"] <= retrieval["R@10"] <= 100
            zetas = [retrieval[f"pmrp_zeta{z}"] for z in (0, 1, 2)]
            assert retrieval["pmrp"] == pytest.approx(np.mean(zetas))
            assert 0 <= retrieval["r_precision"] <= 100
            # Random rejection's AUPRC is the accuracy itself: plausible P@1.
            assert rejection["random"]["auprc"] == pytest.approx(retrieval["P@1"] / 100)
            assert rejection["oracle"]["auprc"] >= rejection["random"]["auprc"]
            methods = {"log_det", "entropy", "feature_uncertainty", "top_mahalanobis"}
            methods |= {"random", "oracle", *BASELINE_NAMES}  # the baselines once, not per T
            methods |= set(DESCRIPTIVE_SCORES)
            for t in CONFIG.temperatures:
                methods |= {f"mutual_information@T{t:g}", f"posterior_entropy@T{t:g}"}
            assert set(rejection) == methods
            assert set(result[direction]["ambiguity_spearman"]) == methods - {"random", "oracle"}
    histogram = report["log_det"]["image"]["histogram"]
    assert sum(histogram["counts"]) == len(embedded.dataset.images)
    crop = report["crop"]
    assert crop["tuples"] > 0
    for metric in CONFIG.metrics:
        for direction in ("i2t", "t2i"):
            assert 0 <= crop["metrics"][metric][direction]["overall"] <= 100


def test_same_seed_gives_the_same_report(report: dict, tiny_model_dir: Path, shapes_dir: Path):
    again = evaluate_model(tiny_model_dir, shapes_dir, "test", CONFIG)
    assert json.dumps(again, sort_keys=True) == json.dumps(report, sort_keys=True)


def test_chunk_size_does_not_change_the_result(embedded: SplitEmbeddings) -> None:
    small = EvalConfig(metrics=("kl",), mc_samples=3, shortlist_size=20, chunk_size=7)
    large = EvalConfig(metrics=("kl",), mc_samples=3, shortlist_size=20, chunk_size=100_000)
    section_small, scores_small = evaluate_direction(embedded, "kl", "t2i", small)
    section_large, scores_large = evaluate_direction(embedded, "kl", "t2i", large)
    assert json.dumps(section_small, sort_keys=True) == json.dumps(section_large, sort_keys=True)
    for name, values in scores_small.items():
        np.testing.assert_array_equal(values, scores_large[name])


def test_scores_use_each_querys_own_shortlist(embedded: SplitEmbeddings) -> None:
    queries, gallery = embedded.captions, embedded.images
    rng = np.random.default_rng(0)
    shortlist = np.stack([rng.permutation(gallery.mu.shape[0])[:5] for _ in queries.mu])
    chunked = dataclasses.replace(CONFIG, chunk_size=7)  # several chunks of queries
    values = direction_scores("w2", queries, gallery, shortlist, chunked)
    for q in (0, len(queries.mu) // 2, len(queries.mu) - 1):
        draws = torch.stack(
            [
                pairwise_distance(
                    "w2",
                    torch.from_numpy(queries.mc_mu[draw, q : q + 1]),
                    torch.from_numpy(queries.mc_logvar[draw, q : q + 1]),
                    torch.from_numpy(gallery.mu[shortlist[q]]),
                    torch.from_numpy(gallery.logvar[shortlist[q]]),
                )
                for draw in range(queries.mc_mu.shape[0])
            ]
        )  # (L, 1, 5)
        for t in CONFIG.temperatures:
            expected = float(mutual_information(draws, t)[0])
            assert values[f"mutual_information@T{t:g}"][q] == pytest.approx(expected, abs=1e-5)
            p = torch.softmax(-draws[:, 0].double() / t, dim=-1).mean(dim=0).numpy()  # (5,)
            entropy = -sum(x * np.log(x) for x in p if x > 0)
            assert values[f"posterior_entropy@T{t:g}"][q] == pytest.approx(entropy, abs=1e-5)
    log_dets = queries.logvar.astype(np.float64).sum(axis=1)
    assert values["log_det"] == pytest.approx(log_dets, rel=1e-5)


def clear_first(row: list[float], tolerance: float = 1e-4) -> int | None:
    """The index of a row's first result by sorted() (the earlier on a tie), or None when the
    second is so close that the rounding of another computation could swap them."""
    order = sorted(range(len(row)), key=lambda m: (row[m], m))
    gap = row[order[1]] - row[order[0]]
    return None if gap <= tolerance * max(1.0, abs(row[order[0]])) else order[0]


def loop_instability(row: list[float], draws: list[list[float]]) -> tuple[float, float]:
    """Bounds on the fraction of draws whose first result is not the row's: exact unless a
    near tie makes a first result uncertain (then it may go either way)."""
    first = clear_first(row)
    firsts = [clear_first(draw) for draw in draws]
    low = sum(first is not None and f is not None and f != first for f in firsts)
    high = sum(first is None or f is None or f != first for f in firsts)
    return low / len(draws), high / len(draws)


def test_baselines_come_from_each_querys_own_shortlist(embedded: SplitEmbeddings) -> None:
    """top1_distance, top1_margin, top1_instability and top1_mean_distance of direction_scores
    against a loop over each query's sorted shortlist distances, its draws' own first results
    and the means of its first result."""
    queries, gallery = embedded.images, embedded.captions
    rng = np.random.default_rng(1)
    shortlist = np.stack([rng.permutation(gallery.mu.shape[0])[:6] for _ in queries.mu])
    chunked = dataclasses.replace(CONFIG, chunk_size=7)  # several chunks of queries
    values = direction_scores("kl", queries, gallery, shortlist, chunked, caption_query=False)
    candidates = [torch.from_numpy(a) for a in (gallery.mu, gallery.logvar)]

    def distances(mu: np.ndarray, logvar: np.ndarray, q: int) -> list[float]:
        one = [torch.from_numpy(a[q : q + 1]) for a in (mu, logvar)]
        rows = [c[shortlist[q]] for c in candidates]
        return pairwise_distance("kl", *one, *rows)[0].double().tolist()  # (6,)

    for q in range(len(queries.mu)):
        row = distances(queries.mu, queries.logvar, q)
        ranked = sorted(row)
        assert values["top1_distance"][q] == pytest.approx(ranked[0], rel=1e-5)
        assert values["top1_margin"][q] == pytest.approx(ranked[0] - ranked[1], abs=1e-4)
        draws = [
            distances(queries.mc_mu[draw], queries.mc_logvar[draw], q)
            for draw in range(queries.mc_mu.shape[0])
        ]
        low, high = loop_instability(row, draws)
        assert low - 1e-12 <= values["top1_instability"][q] <= high + 1e-12
        first = gallery.mu[shortlist[q][row.index(ranked[0])]].astype(np.float64)
        mean_distance = float(((queries.mu[q].astype(np.float64) - first) ** 2).sum())
        assert values["top1_mean_distance"][q] == pytest.approx(mean_distance, rel=1e-5)
    assert not any(name.startswith("top1_") and "@T" in name for name in values)
    expected_variance = np.exp(queries.logvar.astype(np.float64)).sum(axis=1)
    np.testing.assert_allclose(values["total_variance"], expected_variance, rtol=1e-5)
    assert 0 < values["top1_instability"].max() <= 1  # the draws of this model do move


def brute_plausible(distances: np.ndarray, plausible: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Top-1 plausible (ties broken against the model) and R-Precision per query, by a loop."""
    top1, r_precision = [], []
    for q in range(distances.shape[0]):
        order = np.lexsort((plausible[q], distances[q]))  # on a tie, the implausible item first
        count = int(plausible[q].sum())
        top1.append(bool(plausible[q, order[0]]))
        r_precision.append(plausible[q, order[:count]].mean() if count else np.nan)
    return np.array(top1), np.array(r_precision)


def test_plausible_figures_match_a_loop(report: dict, embedded: SplitEmbeddings) -> None:
    captions, images = embedded.dataset.captions, embedded.dataset.images
    plausible = np.array([[is_plausible_match(c, im) for im in images] for c in captions])
    image_emb, caption_emb = embedded.images, embedded.captions
    arrays = (image_emb.mu, image_emb.logvar, caption_emb.mu, caption_emb.logvar)
    tensors = [torch.from_numpy(a) for a in arrays]
    for metric in CONFIG.metrics:
        t2i = pairwise_distance(metric, *tensors[2:], *tensors[:2]).numpy()  # (C, I)
        i2t = pairwise_distance(metric, *tensors).numpy()  # (I, C)
        for direction, d, p in (("t2i", t2i, plausible), ("i2t", i2t, plausible.T)):
            top1, r_precision = brute_plausible(d, p)
            retrieval = report["metrics"][metric][direction]["retrieval"]
            assert retrieval["P@1"] == pytest.approx(100 * top1.mean())
            assert retrieval["r_precision"] == pytest.approx(100 * np.nanmean(r_precision))
            own = np.arange(len(images))[None, :] == embedded.caption_image[:, None]  # (C, I)
            own = own if direction == "t2i" else own.T
            ceiling = np.mean(np.minimum(own.sum(1) / p.sum(1), 1.0))
            assert retrieval["R@1_ceiling"] == pytest.approx(100 * ceiling)


def test_ambiguity_spearman_matches_scipy(embedded: SplitEmbeddings) -> None:
    section, scores = evaluate_direction(embedded, "w2", "t2i", CONFIG)
    captions, images = embedded.dataset.captions, embedded.dataset.images
    count = np.array([sum(is_plausible_match(c, im) for im in images) for c in captions])
    expected = spearmanr(scores["log_det"], np.log(np.maximum(count, 1))).statistic
    assert section["ambiguity_spearman"]["log_det"] == pytest.approx(expected)


def test_exact_plausible_relevance_matches_the_dataset_judgement(
    embedded: SplitEmbeddings,
) -> None:
    captions, images = embedded.dataset.captions, embedded.dataset.images
    rows = np.array([0, 3, 4])
    t2i = PlausibleMatchRelevance(captions, images, queries_are_captions=True).mask(rows)
    i2t = PlausibleMatchRelevance(captions, images, queries_are_captions=False).mask(rows)
    for i, row in enumerate(rows):
        assert t2i[i].tolist() == [is_plausible_match(captions[row], im) for im in images]
        assert i2t[i].tolist() == [is_plausible_match(c, images[row]) for c in captions]


def test_crop_selection_accuracy_on_hand_made_embeddings() -> None:
    def points(*xs: float) -> Embeddings:
        mu = np.array([[x, 0.0] for x in xs], dtype=np.float32)
        return Embeddings(mu=mu, logvar=np.zeros_like(mu))

    # Two tuples. Views A at 0 and 10, views A+B at 1 and 11; candidates "A" at 0.2 and 10.9,
    # "A+B" at 0.9 and 10.1: tuple 0 is right both ways, tuple 1 is wrong both ways.
    accuracy = _selection_accuracy(
        "w2", (points(0, 10), points(1, 11)), (points(0.2, 10.9), points(0.9, 10.1))
    )
    assert accuracy == {"part_a": 50.0, "union": 50.0, "overall": 50.0}


def test_report_files(report: dict, tmp_path: Path) -> None:
    written = write_report(report, tmp_path / "out")
    names = {p.name for p in written}
    assert {"report.json", "report.md", "log_det_histogram.png"} <= names
    assert "precision_coverage_kl_t2i.png" in names and "p1_by_decile_w2_i2t.png" in names
    loaded = json.loads((tmp_path / "out" / "report.json").read_text())
    assert loaded["metrics"]["w2"]["i2t"]["retrieval"]["R@1"] == pytest.approx(
        report["metrics"]["w2"]["i2t"]["retrieval"]["R@1"]
    )
    markdown = (tmp_path / "out" / "report.md").read_text()
    assert "## Retrieval" in markdown and "## Crop experiment" in markdown
    for name in ("top1_distance", "top1_margin", "top1_instability"):
        assert f"| w2 | t2i | {name} |" in markdown and f"| kl | i2t | {name} |" in markdown
    for path in written:
        if path.suffix == ".png":
            with Image.open(path) as image:
                assert image.size[0] > 100


def run_cli(*args: str):
    return CliRunner().invoke(app, ["eval", *args])


def test_cli_writes_the_report(tiny_model_dir: Path, shapes_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "report"
    result = run_cli(
        "--model",
        str(tiny_model_dir),
        "--data",
        str(shapes_dir),
        "--metrics",
        "w2",
        "--mc-samples",
        "2",
        "--report",
        str(out),
    )
    assert result.exit_code == 0, result.output
    assert json.loads((out / "report.json").read_text())["settings"]["metrics"] == ["w2"]


def one_line_error(result) -> str:
    assert result.exit_code != 0
    assert "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, result.output
    return lines[0]


def test_cli_bad_input(tiny_model_dir: Path, shapes_dir: Path, tmp_path: Path) -> None:
    missing = run_cli("--model", str(tmp_path / "nope"), "--data", str(shapes_dir))
    assert "does not exist" in one_line_error(missing) and missing.exit_code == 1
    unknown = run_cli(
        "--model", str(tiny_model_dir), "--data", str(shapes_dir), "--metrics", "w2,cosine2"
    )
    assert "unknown metric 'cosine2'" in one_line_error(unknown) and unknown.exit_code == 2
    no_data = run_cli("--model", str(tiny_model_dir), "--data", str(tmp_path / "none"))
    assert "does not exist" in one_line_error(no_data)
    bad_split = run_cli("--model", str(tiny_model_dir), "--data", str(shapes_dir), "--split", "dev")
    assert "unknown split 'dev'" in one_line_error(bad_split)


def test_cli_rejects_an_empty_split(tiny_model_dir: Path, tmp_path: Path) -> None:
    data = tmp_path / "train_only"
    (data / "images").mkdir(parents=True)
    Image.new("RGB", (64, 64)).save(data / "images" / "a.png")
    (data / "dataset.json").write_text(json.dumps({"name": "t", "version": 1, "label_names": []}))
    image = {"id": "a", "file": "images/a.png", "split": "train", "labels": []}
    (data / "images.jsonl").write_text(json.dumps(image) + "\n")
    caption = {"id": "c", "image_id": "a", "text": "a red circle", "split": "train"}
    (data / "captions.jsonl").write_text(json.dumps(caption) + "\n")
    result = run_cli("--model", str(tiny_model_dir), "--data", str(data))
    assert "0 images and 0 captions" in one_line_error(result)


def test_eval_encodes_on_cpu_when_torch_sees_a_gpu_that_onnx_runtime_cannot_use(
    tiny_model_dir: Path, shapes_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found on a GPU machine whose onnxruntime had no CUDA provider: eval asked ORT for CUDA
    because torch saw a GPU, and failed. Each library now picks its own device."""
    import onnxruntime

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(onnxruntime, "get_available_providers", lambda: ["CPUExecutionProvider"])
    split = embed_split(tiny_model_dir, load_dataset(shapes_dir, "test"), CONFIG)
    assert split.encoders["image"].provider == "CPUExecutionProvider"
    assert np.isfinite(split.images.mu).all()


def test_by_default_each_direction_is_ranked_with_the_services_metric_for_it(
    tiny_model_dir: Path, shapes_dir: Path, report: dict, tmp_path: Path
) -> None:
    import shutil

    from models.evaluation.evaluate import direction_results
    from models.networks.model_config import ModelConfig

    model_dir = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model_dir)
    config = ModelConfig.load(model_dir)
    assert config.search_metric == "w2"
    dataclasses.replace(config, image_query_metric="kl").save(model_dir)
    default = evaluate_model(model_dir, shapes_dir, "test", dataclasses.replace(CONFIG, metrics=()))
    assert default["default_metrics"] == {"t2i": "w2", "i2t": "kl"}
    assert set(default["metrics"]) == {"w2", "kl"}
    ranked = direction_results(default)
    # The same encoders, so each direction's figures are those of its metric in `report`.
    for direction, metric in (("t2i", "w2"), ("i2t", "kl")):
        assert ranked[direction]["retrieval"] == report["metrics"][metric][direction]["retrieval"]
    assert report["metrics"]["w2"]["i2t"]["retrieval"] != ranked["i2t"]["retrieval"]


def test_rejected_share_counts_the_probes_above_the_95th_percentile() -> None:
    own = np.arange(1, 101, dtype=np.float64)  # 95th percentile (linear): 95.05
    probes = np.array([50.0, 95.0, 95.06, 100.0, 1e9])
    assert rejected_share(own, probes) == pytest.approx(3 / 5)
    rng = np.random.default_rng(3)
    many = rng.normal(size=20_000)
    assert rejected_share(many, many) == pytest.approx(0.05, abs=1e-3)
    brute = sorted(many)[int(0.95 * (len(many) - 1)) + 1]  # smallest value above the quantile
    assert rejected_share(many, np.array([brute])) == 1.0


def test_no_match_figure_matches_a_brute_force_loop(report: dict, embedded: SplitEmbeddings):
    """The captions left without a plausible match when half the images leave the gallery,
    found by a loop over is_plausible_match, and the AUROC of the caption's own log-det (which
    no gallery changes) counted pair by pair."""
    images, captions = embedded.dataset.images, embedded.dataset.captions
    kept = np.random.default_rng(CONFIG.seed).random(len(images)) >= NO_MATCH_REMOVED
    lacks = np.array(
        [not any(is_plausible_match(c, im) for im, k in zip(images, kept, strict=True) if k)
         for c in captions]
    )  # fmt: skip
    section = report["metrics"]["w2"]["no_match"]
    assert section["no_match"] == int(lacks.sum()) > 0 and section["captions"] == len(captions)
    assert section["gallery_images"] == int(kept.sum())
    log_det = embedded.captions.logvar.astype(np.float64).sum(1)
    pairs = [(p > n) + 0.5 * (p == n) for p in log_det[lacks] for n in log_det[~lacks]]
    assert section["auroc"]["log_det"] == pytest.approx(np.mean(pairs), abs=1e-9)
    assert set(BASELINE_NAMES) <= set(section["auroc"])
    markdown = markdown_report(report)
    assert "## Nothing in the gallery matches" in markdown
