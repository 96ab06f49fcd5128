"""Calibration of T and tau: the threshold rule against brute force, and `probsearch calibrate`."""

import json
import math
import shutil
import subprocess
import threading
import time
from dataclasses import replace
from pathlib import Path

import httpx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import indexer.calibration as calibration_module
from indexer.calibration import (
    FAMILIAR_QUANTILE,
    OUTLIER_AUROC_FLOOR,
    CalibrationError,
    CalibrationJob,
    Target,
    candidate_name,
    each_metric,
    run_calibration,
    select_threshold,
    summarise,
)
from indexer.manifest import read_manifest, verify_checksums
from indexer.registry import ActiveRegistry
from indexer.version_writer import update_calibration
from models.datasets.records import load_dataset
from models.scoring.query_scores import SCORE_NAMES
from models.threads import ThreadBudget
from tests.service.conftest import (
    PROBSEARCH,
    Artifacts,
    ServerThread,
    copy_index_root,
    make_settings,
    probsearch,
)

EACH_METRIC = calibration_module.each_metric

queries = st.integers(1, 40).flatmap(
    lambda n: st.tuples(
        st.lists(st.sampled_from([0.0, 0.1, 0.2, 0.5, 1.0, 2.0]), min_size=n, max_size=n),
        st.lists(st.booleans(), min_size=n, max_size=n),
    )
)


def brute_force_threshold(mi: np.ndarray, correct: np.ndarray, target: Target) -> float:
    """The largest (precision) or smallest (coverage) distinct MI value meeting the target."""
    candidates = sorted(set(mi.tolist()))
    meets = []
    for tau in candidates:
        kept = mi <= tau
        if target.precision is not None:
            ok = correct[kept].mean() >= target.precision - 1e-12
        else:
            ok = kept.mean() >= target.coverage - 1e-9
        meets.append(ok)
    if target.precision is not None:
        passing = [tau for tau, ok in zip(candidates, meets, strict=True) if ok]
        return max(passing) if passing else candidates[0]
    return min(tau for tau, ok in zip(candidates, meets, strict=True) if ok)


@settings(max_examples=200, deadline=None)
@given(queries, st.sampled_from([0.2, 0.5, 0.75, 1.0]), st.booleans())
def test_threshold_matches_brute_force(data, goal, by_precision) -> None:
    mi, correct = np.array(data[0]), np.array(data[1])
    target = Target(precision=goal) if by_precision else Target(coverage=goal)
    tau, kept = select_threshold(mi, correct, target)
    assert tau == brute_force_threshold(mi, correct, target)
    assert kept == int((mi <= tau).sum())


def test_coverage_threshold_keeps_at_least_the_fraction() -> None:
    mi = np.array([0.3, 0.1, 0.2, 0.4])
    tau, kept = select_threshold(mi, np.ones(4, dtype=bool), Target(coverage=0.5))
    assert (tau, kept) == (0.2, 2)


def test_a_score_constant_up_to_round_off_is_never_chosen() -> None:
    """MI of a model without dropout is 0 up to float round-off; that round-off can rank the
    val queries perfectly by chance, and must not win over a score that varies."""
    rng = np.random.default_rng(0)
    correct = rng.random(200) < 0.5
    round_off = np.where(correct, 0.0, 1e-17)  # a perfect ranking, by accident
    log_det = np.where(correct, 0.0, 1.0) + rng.normal(0, 1.0, 200)  # weaker, but real
    scores = {"mutual_information@T0.1": round_off, "log_det": log_det}
    chosen = summarise("w2", (0.1,), scores, correct, Target(coverage=0.8))
    assert chosen.score == "log_det"
    assert chosen.normalized_auprc["mutual_information@T0.1"] == pytest.approx(0.0)  # chance
    only_constant = summarise("w2", (0.1,), {"mutual_information@T0.1": round_off}, correct,
                              Target(coverage=0.8))  # fmt: skip
    assert only_constant.score == "mutual_information"


def test_a_score_without_temperature_keeps_the_best_posteriors_temperature() -> None:
    """top_mahalanobis does not depend on T, but T still sets each result's posterior score:
    it is the T of the best temperature-dependent candidate, not the first one listed."""
    rng = np.random.default_rng(2)
    correct = rng.random(300) < 0.5
    wrongness = np.where(correct, 0.0, 1.0)
    scores = {
        "top_mahalanobis": wrongness + rng.normal(0, 0.2, 300),
        "posterior_entropy@T0.1": rng.normal(0, 1.0, 300),
        "posterior_entropy@T3": wrongness + rng.normal(0, 1.0, 300),
    }
    chosen = summarise("w2", (0.1, 3.0), scores, correct, Target(coverage=0.8))
    assert (chosen.score, chosen.temperature) == ("top_mahalanobis", 3.0)
    alone = summarise("w2", (0.1, 3.0), {"log_det": wrongness}, correct, Target(coverage=0.8))
    assert (alone.score, alone.temperature) == ("log_det", 0.1)


def test_a_log_det_that_flags_outlier_images_gates_them_beside_the_best_score() -> None:
    """The best-ranking score is chosen; the log-det, which ranks the synthetic outliers above
    the queries, adds a gate at its FAMILIAR_QUANTILE quantile over the queries, and the
    coverage target still holds with the gated queries rejected. A log-det that does not flag
    the outliers adds no gate."""
    rng = np.random.default_rng(1)
    correct = rng.random(300) < 0.5
    sharp = np.where(correct, 0.0, 1.0) + rng.normal(0, 0.3, 300)
    log_det = rng.normal(0, 1.0, 300)  # no help with wrong answers
    scores = {"posterior_entropy@T1": sharp, "log_det": log_det}
    outliers = {"posterior_entropy@T1": rng.normal(0.5, 0.5, 100), "log_det": np.full(100, 9.0)}
    chosen = summarise("w2", (1.0,), scores, correct, Target(coverage=0.8), outliers)
    assert chosen.score == "posterior_entropy"
    assert chosen.gate_score == "log_det"
    assert chosen.gate_limit == pytest.approx(np.quantile(log_det, FAMILIAR_QUANTILE))
    assert chosen.outlier_auroc["log_det"] == 1.0
    assert chosen.outliers_rejected == 1.0
    kept = (sharp <= chosen.threshold) & (log_det <= chosen.gate_limit)
    assert chosen.kept_fraction == kept.mean() >= 0.8
    assert chosen.target_met
    hidden = {**outliers, "log_det": rng.normal(0, 1.0, 100)}
    ungated = summarise("w2", (1.0,), scores, correct, Target(coverage=0.8), hidden)
    assert ungated.gate_limit is None
    assert ungated.outlier_auroc["log_det"] < OUTLIER_AUROC_FLOOR
    plain = summarise("w2", (1.0,), scores, correct, Target(coverage=0.8))
    assert plain.outlier_auroc == {} and plain.gate_note() == ""
    assert chosen.gate_note() == (
        f"; log_det gate {chosen.gate_limit:.4g}, rejects 100% of outlier images"
    )
    assert ungated.gate_note().startswith("; rejects ") and "gate" not in ungated.gate_note()


def test_the_gate_reads_the_familiarity_score_that_flags_the_outliers_best() -> None:
    """With both novelty and log_det flagging the outliers, the better one gates (novelty at
    equal AUROC); the gate's limit is its FAMILIAR_QUANTILE quantile over the queries."""
    rng = np.random.default_rng(2)
    correct = rng.random(300) < 0.5
    novelty, log_det = rng.random(300), rng.normal(0, 1.0, 300)
    scores = {"top_mahalanobis": np.where(correct, 0.0, 1.0), "novelty": novelty,
              "log_det": log_det}  # fmt: skip
    outliers = {"top_mahalanobis": np.zeros(50), "novelty": np.full(50, 2.0),
                "log_det": np.linspace(-1.0, 9.0, 50)}  # fmt: skip
    chosen = summarise("w2", (1.0,), scores, correct, Target(coverage=0.8), outliers)
    assert (chosen.score, chosen.gate_score) == ("top_mahalanobis", "novelty")
    assert chosen.gate_limit == pytest.approx(np.quantile(novelty, FAMILIAR_QUANTILE))
    assert chosen.gate_note().startswith(f"; novelty gate {chosen.gate_limit:.4g}, rejects 100%")
    tied = {**outliers, "log_det": np.full(50, 9.0)}
    assert summarise("w2", (1.0,), scores, correct, Target(coverage=0.8), tied).gate_score == (
        "novelty"
    )
    blind = {**outliers, "novelty": rng.random(50)}
    fallback = summarise("w2", (1.0,), scores, correct, Target(coverage=0.8), blind)
    assert fallback.gate_score == "log_det"
    assert fallback.gate_limit == pytest.approx(np.quantile(log_det, FAMILIAR_QUANTILE))


@pytest.mark.parametrize(
    ("precision", "coverage"), [(None, None), (0.9, 0.5), (0.0, None), (None, 1.5)]
)
def test_target_must_be_one_value_in_range(precision, coverage) -> None:
    with pytest.raises(CalibrationError):
        Target(precision=precision, coverage=coverage)


@pytest.fixture(scope="module")
def calibrated(artifacts: Artifacts, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the session's index root, calibrated on the val split by the CLI."""
    root = copy_index_root(artifacts, tmp_path_factory.mktemp("calibrated") / "indexes")
    probsearch(
        "calibrate", "--data", artifacts.shapes, "--index-root", root, "--model", artifacts.model,
        "--target-coverage", "0.6", "--mc-samples", "4",
    )  # fmt: skip
    return root


@pytest.mark.parametrize("modality", ["image", "text"])
def test_calibrate_records_score_t_and_tau_per_metric(calibrated: Path, modality: str) -> None:
    registry = ActiveRegistry(calibrated, None)
    version_dir = registry.version_path(modality, registry.active_version(modality))
    manifest = read_manifest(version_dir)
    evidence = json.loads((version_dir / "calibration.json").read_text())
    verify_checksums(version_dir, manifest)
    assert set(manifest.calibration) == set(manifest.metrics) == set(evidence["metrics"])
    for metric, calibration in manifest.calibration.items():
        result = evidence["metrics"][metric]
        assert calibration.temperature == result["temperature"]
        assert calibration.threshold == result["threshold"]
        assert calibration.score == result["score"] in SCORE_NAMES
        quality, outliers = result["normalized_auprc"], result["outlier_auroc"]
        assert set(outliers) == (set(quality) if modality == "text" else set())
        chosen = candidate_name(calibration.score, calibration.temperature)
        assert math.isclose(quality[chosen], max(quality.values()))
        assert calibration.gate_score == result["gate_score"]
        assert calibration.gate_limit == result["gate_limit"]
        if outliers.get("log_det", 0.0) < OUTLIER_AUROC_FLOOR:
            assert calibration.gate_limit is None
        assert result["kept_fraction"] >= 0.6
        assert result["target_met"]


def test_calibrate_refuses_two_targets(artifacts: Artifacts) -> None:
    done = subprocess.run(
        [str(PROBSEARCH), "calibrate", "--data", str(artifacts.shapes), "--index-root",
         str(artifacts.index_root), "--model", str(artifacts.model),
         "--target-precision", "0.5", "--target-coverage", "0.5"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    assert "exactly one of --target-precision and --target-coverage" in done.stderr
    assert "Traceback" not in done.stderr


def test_calibrate_without_an_active_index(artifacts: Artifacts, tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    done = subprocess.run(
        [str(PROBSEARCH), "calibrate", "--data", str(artifacts.shapes), "--index-root",
         str(tmp_path / "empty"), "--model", str(artifacts.model), "--target-coverage", "0.5"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    assert "no active image index" in done.stderr


def test_the_service_rejects_with_the_calibrated_score(calibrated: Path, artifacts: Artifacts):
    registry = ActiveRegistry(calibrated, None)
    manifest = read_manifest(registry.version_path("image", registry.active_version("image")))
    captions = ["a red circle", "two shapes", "a violet star left of a green box", "an object"]
    seen = []
    with (
        ServerThread(make_settings(artifacts, index_root=calibrated)) as running,
        httpx.Client(base_url=running.url, timeout=30) as http,
    ):
        for text in captions:
            for metric in manifest.metrics:
                body = http.post("/search/text", json={"text": text, "metric": metric})
                query = body.json()["query"]
                calibration = manifest.calibration[metric]
                reject = query["reject_score"]
                assert reject["name"] == calibration.score
                assert reject["threshold"] == calibration.threshold
                assert reject["value"] == query[calibration.score]
                assert query["rejected"] is (reject["value"] > reject["threshold"])
                seen.append(query["rejected"])
    assert True in seen and False in seen  # coverage 0.6 rejects some of these, keeps others


def test_an_image_above_the_familiarity_gate_is_rejected_by_its_log_det(
    calibrated: Path, artifacts: Artifacts, tmp_path: Path
) -> None:
    """A gate below every image's log-det rejects every image query, naming log_det as the
    reject score; a request's own threshold replaces the calibrated rule, gate included."""
    root = Path(shutil.copytree(calibrated, tmp_path / "indexes"))
    registry = ActiveRegistry(root, None)
    version_dir = registry.version_path("text", registry.active_version("text"))
    manifest = read_manifest(version_dir)
    gated = {
        m: replace(c, gate_score="log_det", gate_limit=-1e9)
        for m, c in manifest.calibration.items()
    }
    update_calibration(version_dir, gated)
    image = next((artifacts.shapes / "images").glob("*.png")).read_bytes()
    with (
        ServerThread(make_settings(artifacts, index_root=root)) as running,
        httpx.Client(base_url=running.url, timeout=30) as http,
    ):
        for metric in manifest.metrics:
            files = {"image": ("shape.png", image, "image/png")}
            query = http.post("/search/image", files=files, data={"metric": metric}).json()
            assert query["query"]["reject_score"] == {
                "name": "log_det", "value": query["query"]["log_det"], "threshold": -1e9,
            }  # fmt: skip
            assert query["query"]["rejected"] is True
            own = {"metric": metric, "reject_threshold": "1e9"}
            kept = http.post("/search/image", files=files, data=own).json()["query"]
            assert kept["reject_score"]["name"] == manifest.calibration[metric].score
            assert kept["rejected"] is False


def test_each_metric_runs_metrics_at_once_and_keeps_their_order() -> None:
    """Two metrics must meet at a barrier, so one at a time fails (the barrier breaks); the
    first one waits longer, and the results still come back in the metrics' order."""
    barrier = threading.Barrier(2, timeout=20)

    def calibrated(metric: str) -> str:
        if metric in ("w2", "kl"):
            barrier.wait()
        time.sleep(0.2 if metric == "w2" else 0.0)
        return metric.upper()

    metrics = ["w2", "kl", "csd"]
    assert each_metric(calibrated, metrics, workers=2) == ["W2", "KL", "CSD"]
    assert each_metric(str.upper, metrics, workers=1) == ["W2", "KL", "CSD"]


def test_metrics_calibrated_at_once_write_what_one_at_a_time_writes(
    artifacts: Artifacts, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    written = {}
    for workers in (1, 2):
        root = copy_index_root(artifacts, tmp_path / f"workers{workers}")
        registry = ActiveRegistry(root, None)
        version_dir = registry.version_path("image", registry.active_version("image"))
        monkeypatch.setattr(
            calibration_module, "each_metric", lambda f, m, _w, n=workers: EACH_METRIC(f, m, n)
        )
        run_calibration(
            CalibrationJob(
                version_dir=version_dir, model_dir=artifacts.model, data_dir=artifacts.shapes,
                target=Target(coverage=0.6), mc_samples=4, threads=ThreadBudget(1),
            )
        )  # fmt: skip
        written[workers] = (version_dir / "calibration.json").read_bytes()
    assert len(read_manifest(version_dir).metrics) > 1
    assert written[1] == written[2]


def test_metrics_calibrated_at_once_share_one_progress_bar(
    artifacts: Artifacts, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """Two metrics scored at once advance one bar to metrics x queries, instead of two bars
    writing over each other's line."""
    root = copy_index_root(artifacts, tmp_path / "indexes")
    registry = ActiveRegistry(root, None)
    version_dir = registry.version_path("image", registry.active_version("image"))
    metrics = read_manifest(version_dir).metrics
    run_calibration(
        CalibrationJob(
            version_dir=version_dir, model_dir=artifacts.model, data_dir=artifacts.shapes,
            target=Target(coverage=0.6), mc_samples=4, threads=ThreadBudget(1),
        )
    )  # fmt: skip
    queries = len(load_dataset(artifacts.shapes).split("val").captions)
    err = capsys.readouterr().err
    assert len(metrics) > 1
    assert not any(f"calibrate {metric}:" in err for metric in metrics)
    total = len(metrics) * queries
    assert f"calibrate the image gallery ({', '.join(metrics)}): 100%" in err
    assert f" {total}/{total} " in err
