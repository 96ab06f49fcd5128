"""Does ranking synthetic outliers above real images (outlier exposure on the image log-det)
make real photographs look uncertain, at no cost to retrieval? The demo's recipe with and
without `outlier_ranking_weight`, several training seeds each, on a shapes dataset that
docs/results.md and the recipe screens never used; figures read on its test split and on
real photographs (`probsearch data photos`), which no training or choice saw.

    python benchmarks/outlier_ranking.py --seeds 0,1,2 --parallel 2
    python benchmarks/outlier_ranking.py --seeds 0 --images 300 --epochs 1 --out /tmp/o.md
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from multiprocessing import get_context
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from seeded_runs import header, mean_sd, parse_args, prepare

VARIANTS = {"demo": 0.0, "demo + outlier ranking": 1.0}  # name -> outlier_ranking_weight
FIGURES = (  # (column title, reader of one test report)
    ("t2i P@1 single object", lambda t: t["t2i"]["retrieval"]["P@1_single_object"]),
    ("t2i P@1", lambda t: t["t2i"]["retrieval"]["P@1"]),
    ("i2t P@1", lambda t: t["i2t"]["retrieval"]["P@1"]),
    ("t2i PMRP", lambda t: t["t2i"]["retrieval"]["pmrp"]),
    ("i2t PMRP", lambda t: t["i2t"]["retrieval"]["pmrp"]),
    ("photographs AUROC, image log-det", lambda t: t["ood"]["auroc"]["log_det"]),
    ("i2t nAUPRC, image log-det", lambda t: t["i2t"]["rejection"]["log_det"]["normalized_auprc"]),
)


def run_one(name: str, seed: int, work_dir: Path, images: int, epochs: int) -> dict:
    """Train (unless cached) one variant with one training seed; its test report's figures."""
    import torch

    from models.allocator import keep_freed_memory
    from models.evaluation.evaluate import EvalConfig, evaluate_model
    from models.training.train import train
    from probsearch.demo import DemoPlan, demo_model

    keep_freed_memory()
    torch.set_num_threads(1)
    model_dir = work_dir / "models" / f"{name.replace(' ', '')}-seed{seed}"
    if not (model_dir / "text_encoder.onnx").is_file():
        model, training = demo_model(DemoPlan(images=images, epochs=epochs, seed=seed))
        training = replace(training, outlier_ranking_weight=VARIANTS[name])
        train(work_dir / "data", model_dir, model, training, progress=False, log=print)
    config = EvalConfig(mc_samples=0, ood_dir=str(work_dir / "photos"))
    test = evaluate_model(model_dir, work_dir / "data", "test", config)
    metric = next(iter(test["metrics"]))
    return {title: read(test["metrics"][metric]) for title, read in FIGURES}


def render(args: argparse.Namespace, rows: dict[str, list[dict]], seconds: float) -> str:
    lines = [
        *header(args, "Outlier ranking: photographs against shapes images", seconds),
        f"Data: shapes seed {args.data_seed}, {args.images} images (used by no other result); "
        f"training seeds {args.seeds}; figures on its test split, mean ± sd over the seeds, "
        "ranked with the model's metric; photographs from `probsearch data photos`.",
        "",
        "| recipe | " + " | ".join(title for title, _ in FIGURES) + " |",
        "| --- |" + " --- |" * len(FIGURES),
    ]
    for name, runs in rows.items():
        cells = [mean_sd([run[title] for run in runs]) for title, _ in FIGURES]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    args = parse_args(__doc__, "outlier_ranking", data_seed=13)
    started = time.perf_counter()
    seeds = prepare(args)
    jobs = [(name, seed) for name in VARIANTS for seed in seeds]
    with ProcessPoolExecutor(args.parallel, mp_context=get_context("spawn")) as pool:
        futures = {
            job: pool.submit(run_one, *job, args.work_dir, args.images, args.epochs) for job in jobs
        }
        rows = {name: [futures[(name, seed)].result() for seed in seeds] for name in VARIANTS}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(render(args, rows, time.perf_counter() - started))
    print(args.out.read_text())


if __name__ == "__main__":
    main()
