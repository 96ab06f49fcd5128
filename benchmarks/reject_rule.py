"""The service's reject rule, measured as the service applies it, on data nothing was chosen on.

For each training seed: train the demo's recipe (probsearch.demo.demo_model) on a shapes dataset
docs/results.md never used, index its test split (both galleries), run `probsearch calibrate`'s
code on the val split, then score the test queries and real photographs (`probsearch data
photos`) with the calibration's own scoring (indexer.calibration.query_scores_by_candidate:
shortlist, exact re-rank, models.scoring) and apply the calibrated rule: the chosen score
against tau, and for image queries the log-det gate. Writes, mean ± sd over the seeds: the
plausible P@1 of single-object captions; per direction the normalised AUPRC of the rule's
score on test (a query is right when its top-1 is a plausible match) and the fraction of test
queries rejected; for photographs the AUROC of the rule's score against the test images and
the fraction rejected.

    python benchmarks/reject_rule.py --seeds 0,1,2 --parallel 2
    python benchmarks/reject_rule.py --seeds 0 --images 300 --epochs 1 --out /tmp/r.md
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from seeded_runs import header, mean_sd, parse_args, prepare

COVERAGE = 0.8  # the demo's calibration target


def gallery_metrics() -> dict[str, str]:
    """The metric the demo's recipe ranks each gallery with by default (the service's)."""
    from probsearch.demo import DemoPlan, demo_model

    model, _ = demo_model(DemoPlan())
    return {gallery: model.default_metric(gallery) for gallery in ("image", "text")}


def rule_scores(
    version, metric, calibration, embeddings, judge, device
) -> tuple[np.ndarray, np.ndarray]:
    """Each query's value of the rule's score (inf above the familiarity gate) and correctness."""
    from indexer.calibration import candidate_name, query_scores_by_candidate
    from models.scoring.query_scores import gated

    scores, correct = query_scores_by_candidate(
        version, metric, embeddings, judge, (calibration.temperature,), 100, device
    )
    values = scores[candidate_name(calibration.score, calibration.temperature)]
    gate = scores[calibration.gate_score]
    return gated(values, gate, calibration.gate_limit), correct


def run_one(seed: int, work_dir: Path, images: int, epochs: int) -> dict[str, float]:
    """Train (unless cached), index, calibrate and measure one training seed."""
    import torch

    from indexer.calibration import CalibrationJob, Judge, Target, run_calibration
    from indexer.publish import ReindexJob, run_reindex
    from indexer.registry import ActiveRegistry
    from indexer.store import IndexVersion
    from models.allocator import keep_freed_memory
    from models.datasets.records import load_dataset
    from models.evaluation.evaluate import EvalConfig, evaluate_model
    from models.evaluation.rejection_metrics import (
        auroc,
        normalized_auprc,
        oracle_rejection,
        precision_coverage,
        random_rejection,
    )
    from models.networks.preprocess import load_image
    from models.onnx.encoder_runtime import OnnxEncoder
    from models.scoring.rerank import compute_device
    from models.training.train import train
    from probsearch.demo import DemoPlan, demo_model

    keep_freed_memory()
    torch.set_num_threads(1)
    data, run = work_dir / "data", work_dir / f"seed{seed}"
    model_dir = run / "model"
    if not (model_dir / "text_encoder.onnx").is_file():
        plan = DemoPlan(images=images, epochs=epochs, seed=seed)
        train(data, model_dir, *demo_model(plan), progress=False, log=print)
    metrics = gallery_metrics()  # the recipe's, so models linked in from recipe_seeds share it
    config = EvalConfig(mc_samples=0, metrics=(metrics["image"],))
    test = evaluate_model(model_dir, data, "test", config)
    out = {
        "single-object P@1": test["metrics"][metrics["image"]]["t2i"]["retrieval"][
            "P@1_single_object"
        ]
    }
    dataset, device = load_dataset(data), compute_device("cpu")
    registry = ActiveRegistry(run / "indexes", None)
    photos = [load_image(p) for p in sorted((work_dir / "photos").glob("*.png"))]
    for gallery, direction in (("image", "t2i"), ("text", "i2t")):
        metric = metrics[gallery]
        job = ReindexJob(modality=gallery, source=data, model_dir=model_dir,
                         index_root=run / "indexes", metrics=(metric,), split="test",
                         progress=False, seed=seed)  # fmt: skip
        version_dir = registry.version_path(gallery, run_reindex(job).version)
        run_calibration(CalibrationJob(version_dir=version_dir, model_dir=model_dir,
                                       data_dir=data, target=Target(coverage=COVERAGE),
                                       mc_samples=2, seed=seed, metrics=(metric,)))  # fmt: skip
        version = IndexVersion(version_dir)
        calibration = version.manifest.calibration[metric]
        encoder = OnnxEncoder(model_dir, "text" if gallery == "image" else "image")
        split = dataset.split("test")
        queries = split.captions if gallery == "image" else split.images
        if gallery == "image":
            embeddings = encoder.encode_texts([q.text for q in queries], 2, seed)
        else:
            embeddings = encoder.encode_images([load_image(q.path) for q in queries], 2, seed)
        values, correct = rule_scores(
            version, metric, calibration, embeddings, Judge(queries, dataset, gallery), device
        )
        chance, best = random_rejection(correct).auprc, oracle_rejection(correct).auprc
        finite = np.where(np.isinf(values), np.finfo(np.float64).max, values)
        quality = normalized_auprc(precision_coverage(finite, correct).auprc, chance, best)
        out[f"{direction} nAUPRC"] = quality
        out[f"{direction} wrong %"] = 100 * (1 - float(np.mean(correct)))
        out[f"{direction} rejected %"] = 100 * float((values > calibration.threshold).mean())
        if gallery == "text":
            photo_embeddings = encoder.encode_images(photos, 2, seed)
            photo_values, _ = rule_scores(
                version, metric, calibration, photo_embeddings, lambda q, item: False, device
            )
            finite_photos = np.where(np.isinf(photo_values), np.finfo(np.float64).max, photo_values)
            out["photographs AUROC"] = auroc(finite, finite_photos)
            out["photographs rejected %"] = 100 * float(
                (photo_values > calibration.threshold).mean()
            )
            out["image-query score"] = calibration.score
            out["log-det gate"] = calibration.gate_limit is not None
        version.close()
    return out


def render(args: argparse.Namespace, runs: list[dict], seconds: float) -> str:
    columns = [k for k in runs[0] if not isinstance(runs[0][k], (str, bool))]
    lines = [
        *header(args, "The service's reject rule on held-out data", seconds),
        f"Data: shapes seed {args.data_seed}, {args.images} images; the demo's recipe, training "
        f"seeds {args.seeds}; metric per gallery {gallery_metrics()}; calibrated on val at "
        f"coverage {COVERAGE}, read on "
        f"test and on {len(list((args.work_dir / 'photos').glob('*.png')))} photographs.",
        f"Image-query score chosen per seed: {', '.join(str(r['image-query score']) for r in runs)}"
        f"; log-det gate set: {', '.join(str(r['log-det gate']) for r in runs)}.",
        "",
        "| " + " | ".join(columns) + " |",
        "|" + " --- |" * len(columns),
    ]
    cells = [mean_sd([r[column] for r in runs]) for column in columns]
    lines += ["| " + " | ".join(cells) + " |", "", "Per training seed:", ""]
    lines += ["| seed | " + " | ".join(columns) + " |", "|" + " --- |" * (len(columns) + 1)]
    for seed, r in zip(args.seeds.split(","), runs, strict=True):
        lines.append(f"| {seed} | " + " | ".join(f"{r[c]:.3g}" for c in columns) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    args = parse_args(__doc__, "reject_rule", data_seed=11)
    started = time.perf_counter()
    seeds = prepare(args)
    with ProcessPoolExecutor(args.parallel, mp_context=get_context("spawn")) as pool:
        futures = [
            pool.submit(run_one, seed, args.work_dir, args.images, args.epochs) for seed in seeds
        ]
        runs = [f.result() for f in futures]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(render(args, runs, time.perf_counter() - started))
    print(args.out.read_text())


if __name__ == "__main__":
    main()
