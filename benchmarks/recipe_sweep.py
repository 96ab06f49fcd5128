"""Recipe sweep: which data size, capacity and positives let the demo's model answer
single-object captions ("a purple star") right? Trains each recipe of RECIPES on a shapes
dataset of its size (data seed 3, used nowhere else) and scores every model on one fixed
selection split: the val split of a separate dataset (seed 5). Neither seed is the one
docs/results.md (0) or the held-out check (7) report on, so choosing here tunes nothing
that is reported.

    python benchmarks/recipe_sweep.py --work-dir runs/recipe_sweep --parallel 9
    python benchmarks/recipe_sweep.py --recipes base,plausible --parallel 2 --threads 1

Each recipe trains in its own process (torch threads --threads each, CUDA when present);
results go to --out as a Markdown table with the machine, load and command.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field, replace
from multiprocessing import get_context
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ROOT = Path(__file__).resolve().parents[1]
SELECTION_SEED, SELECTION_IMAGES = 5, 2500
DATA_SEED = 3


@dataclass(frozen=True)
class Recipe:
    name: str
    images: int = 2500
    model: dict[str, Any] = field(default_factory=dict)
    training: dict[str, Any] = field(default_factory=dict)


WIDE = {"cnn_channels": (32, 64, 128, 256), "image_features": 256}
WIDER = {"cnn_channels": (64, 128, 256, 256), "image_features": 256}
PLAUSIBLE = {"positives": "plausible"}
# Every recipe starts from the demo's recipe as it was first measured: the strided trunk with
# MC-dropout 0.1, no outliers, no counterfactuals, no attribute probe (the demo has since taken
# the max-pool trunk, probsearch.demo.DEMO_TRUNK, and the rest); a recipe's own fields go on top.
# The demo's outlier ranking stays on; a recipe without outliers must turn it off.
STRIDED = {"image_pooling": "grid", "cnn_downsample": "stride", "stem_stride": 2,
           "cnn_channels": (16, 32, 64, 128), "dropout": 0.1}  # fmt: skip
FIRST_TRAINING = {"outlier_fraction": 0.0, "counterfactual_weight": 0.0,
                  "attribute_weight": 0.0}  # fmt: skip
OBJECTS = {"image_pooling": "objects"}
MAXPOOL_OBJECTS = {**OBJECTS, "cnn_downsample": "maxpool", "stem_stride": 1}
NARROW_OBJECTS = {**MAXPOOL_OBJECTS, "cnn_channels": (8, 16, 32, 64)}
NODROP = {**NARROW_OBJECTS, "dropout": 0.0}  # the demo's trunk since session 6
# The demo's counterfactual images and outliers (sessions 6-10); the session-11 recipes add to it.
SWAPS_OUTLIERS = {"counterfactual_weight": 10.0, "counterfactuals": "images",
                  "outlier_fraction": 0.25}  # fmt: skip
VSE_NODROP = {"model_type": "vse", **NODROP}
# vse has no variance to fit and no outliers, so the demo's outlier ranking is off.
VSE_SWAPS = {"variance_objective": "", "counterfactual_weight": 10.0, "counterfactuals": "images",
             "outlier_ranking_weight": 0.0}  # fmt: skip
# fmt: off
RECIPES: tuple[Recipe, ...] = (
    Recipe("base"),
    Recipe("plausible", training={"positives": "plausible"}),
    Recipe("n10k", images=10000),
    Recipe("n10k-plausible", images=10000, training={"positives": "plausible"}),
    Recipe("wide", model=WIDE),
    Recipe("stem1", model={"stem_stride": 1}),
    Recipe("bs128", training={"batch_size": 128}),
    Recipe("hardest-plausible", training={"negatives": "hardest", "positives": "plausible"}),
    Recipe("n10k-wide-plausible-40", images=10000, model=WIDE,
           training={"positives": "plausible", "epochs": 40, "patience": 8}),
    Recipe("n10k-wide-40", images=10000, model=WIDE, training={"epochs": 40, "patience": 8}),
    Recipe("n10k-wide-plausible-60", images=10000, model=WIDE,
           training={**PLAUSIBLE, "epochs": 60, "patience": 8}),
    Recipe("n10k-wider-plausible-40", images=10000, model=WIDER,
           training={**PLAUSIBLE, "epochs": 40, "patience": 8}),
    Recipe("n20k-wide-plausible-25", images=20000, model=WIDE,
           training={**PLAUSIBLE, "epochs": 25, "patience": 8}),
    Recipe("objects", model=OBJECTS),
    Recipe("objects-plausible", model=OBJECTS, training=PLAUSIBLE),
    Recipe("labels", training={"label_weight": 1.0}),
    Recipe("labels-0.3", training={"label_weight": 0.3}),
    Recipe("mp1-objects", model=MAXPOOL_OBJECTS),
    Recipe("mp2-objects", model={**OBJECTS, "cnn_downsample": "maxpool"}),
    Recipe("mp1-objects-labels", model=MAXPOOL_OBJECTS, training={"label_weight": 0.3}),
    Recipe("mp1-objects-30", model=MAXPOOL_OBJECTS, training={"epochs": 30}),
    Recipe("mp1-narrow-objects", model=NARROW_OBJECTS),
    Recipe("mp1-slim-objects", model={**MAXPOOL_OBJECTS, "cnn_channels": (8, 16, 64, 128)}),
    Recipe("narrow-labels", model=NARROW_OBJECTS, training={"label_weight": 1.0, "patience": 0}),
    Recipe("narrow-plausible", model=NARROW_OBJECTS, training=PLAUSIBLE),
    Recipe("narrow-plausible-images", model=NARROW_OBJECTS,
           training={"positives": "plausible_images"}),
    Recipe("narrow-outliers", model=NARROW_OBJECTS, training={"outlier_fraction": 0.25}),
    Recipe("narrow-swaps", model=NARROW_OBJECTS,
           training={"counterfactual_weight": 1.0, "counterfactuals": "captions"}),
    Recipe("narrow-swaps-3", model=NARROW_OBJECTS,
           training={"counterfactual_weight": 3.0, "counterfactuals": "captions"}),
    Recipe("narrow-swaps-outliers", model=NARROW_OBJECTS,
           training={"counterfactual_weight": 1.0, "counterfactuals": "captions",
                     "outlier_fraction": 0.25}),
    Recipe("narrow-image-swaps", model=NARROW_OBJECTS,
           training={"counterfactual_weight": 1.0, "counterfactuals": "images"}),
    Recipe("narrow-image-swaps-10", model=NARROW_OBJECTS,
           training={"counterfactual_weight": 10.0, "counterfactuals": "images"}),
    Recipe("narrow-both-swaps-30", model=NARROW_OBJECTS,
           training={"counterfactual_weight": 30.0, "counterfactuals": "both"}),
    Recipe("narrow-image-swaps-10-nodrop", model={**NARROW_OBJECTS, "dropout": 0.0},
           training={"counterfactual_weight": 10.0, "counterfactuals": "images"}),
    Recipe("wide-image-swaps-10", model={**NARROW_OBJECTS, "cnn_channels": (16, 32, 64, 128)},
           training={"counterfactual_weight": 10.0, "counterfactuals": "images"}),
    Recipe("narrow-nodrop-outliers", model={**NARROW_OBJECTS, "dropout": 0.0},
           training={"outlier_fraction": 0.25}),
    Recipe("narrow-image-swaps-10-nodrop-outliers", model=NODROP, training=SWAPS_OUTLIERS),
    Recipe("narrow-image-swaps-10-nodrop-outliers-plausible-images", model=NODROP,
           training={**SWAPS_OUTLIERS, "positives": "plausible_images"}),
    Recipe("narrow-image-swaps-10-nodrop-outliers-labels", model=NODROP,
           training={**SWAPS_OUTLIERS, "label_weight": 1.0}),
    *(Recipe(f"narrow-image-swaps-10-nodrop-outliers-attributes{suffix}", model=NODROP,
             training={**SWAPS_OUTLIERS, "attribute_weight": weight})
      for suffix, weight in (("", 1.0), ("-10", 10.0), ("-30", 30.0), ("-100", 100.0))),
    Recipe("narrow-both-swaps-10-nodrop-outliers-attributes-100", model=NODROP,
           training={**SWAPS_OUTLIERS, "counterfactuals": "both", "attribute_weight": 100.0}),
    Recipe("narrow-size-swaps-10-nodrop-outliers-attributes-100", model=NODROP,
           training={**SWAPS_OUTLIERS, "counterfactuals": "both", "caption_swaps": "size",
                     "attribute_weight": 100.0}),
    Recipe("narrow-image-swaps-10-nodrop-outliers-40", model=NODROP,
           training={**SWAPS_OUTLIERS, "epochs": 40, "patience": 8}),
    Recipe("narrow-both-swaps-outliers", model=NARROW_OBJECTS,
           training={"counterfactual_weight": 1.0, "counterfactuals": "both",
                     "outlier_fraction": 0.25}),
    Recipe("vse", model={"model_type": "vse"},
           training={"variance_objective": "", "outlier_ranking_weight": 0.0}),
    Recipe("vse-mp1-narrow-objects", model={"model_type": "vse", **NARROW_OBJECTS},
           training={"variance_objective": "", "outlier_ranking_weight": 0.0}),
    Recipe("vse-narrow-nodrop", model={"model_type": "vse", **NARROW_OBJECTS, "dropout": 0.0},
           training={"variance_objective": "", "outlier_ranking_weight": 0.0}),
    Recipe("vse-narrow-image-swaps-10-nodrop", model=VSE_NODROP, training=VSE_SWAPS),
    Recipe("vse-narrow-image-swaps-10-nodrop-attributes-100", model=VSE_NODROP,
           training={**VSE_SWAPS, "attribute_weight": 100.0}),
    Recipe("vse-narrow-size-swaps-10-nodrop-attributes-100", model=VSE_NODROP,
           training={**VSE_SWAPS, "counterfactuals": "both", "caption_swaps": "size",
                     "attribute_weight": 100.0}),
)
# fmt: on


def dataset(work_dir: Path, images: int, seed: int) -> Path:
    from models.datasets.shapes import generate_shapes

    out = work_dir / f"data-s{seed}-n{images}"
    if not (out / "dataset.json").is_file():
        generate_shapes(out, images, seed=seed, overwrite=True, progress=False)
    return out


def run_recipe(recipe: Recipe, work_dir: Path, selection: Path, threads: int) -> dict:
    """Train (unless cached) and score one recipe on the selection split."""
    import torch

    from models.evaluation.evaluate import EvalConfig, evaluate_model
    from models.training.train import train
    from probsearch.demo import DemoPlan, demo_model

    torch.set_num_threads(threads)
    model_dir = work_dir / "models" / recipe.name
    started = time.perf_counter()
    if not (model_dir / "text_encoder.onnx").is_file():
        model, training = demo_model(DemoPlan(images=recipe.images))
        model = replace(model, **{**STRIDED, **recipe.model})
        training = replace(training, **{**FIRST_TRAINING, **recipe.training})
        data = dataset(work_dir, recipe.images, DATA_SEED)
        train(data, model_dir, model, training, progress=False, log=lambda _: None)
    train_s = time.perf_counter() - started
    report = evaluate_model(model_dir, selection, "val", EvalConfig(mc_samples=0))
    history = json.loads((model_dir / "history.json").read_text())
    return {"recipe": recipe, "report": report, "train_s": train_s, "history": history}


def row(result: dict) -> str:
    from models.evaluation.evaluate import direction_results

    recipe, report = result["recipe"], result["report"]
    ranked = direction_results(report)
    i2t, t2i = ranked["i2t"]["retrieval"], ranked["t2i"]["retrieval"]
    epochs = result["history"]
    best = max(epochs, key=lambda e: e["score"])
    cells = [
        recipe.name,
        str(recipe.images),
        f"{best['epoch']}/{len(epochs)}",
        f"{result['train_s'] / 60:.1f}",
        f"{t2i['P@1_single_object']:.1f}",
        f"{t2i['P@1']:.1f}",
        f"{i2t['P@1']:.1f}",
        f"{t2i['r_precision']:.1f}",
        f"{i2t['r_precision']:.1f}",
        f"{t2i['pmrp']:.1f}",
        f"{i2t['pmrp']:.1f}",
    ]
    return "| " + " | ".join(cells) + " |"


def write_table(
    args: argparse.Namespace,
    command: str,
    recipes: list[Recipe],
    results: list[dict],
    load: float,
    seconds: float,
) -> None:
    """The Markdown table of the recipes finished so far, in RECIPES order."""
    import torch

    order = {r.name: i for i, r in enumerate(recipes)}
    results = sorted(results, key=lambda r: order[r["recipe"].name])
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
    lines = [
        "# Recipe sweep: the demo's recipe with more data, capacity or plausible positives",
        "",
        f"Command: `{command}`; machine: {platform.machine()}, {os.cpu_count()} CPUs, {device}; "
        f"load (1 min) {load:.1f} at start; wall time {seconds / 60:.1f} min; "
        f"{len(results)} of {len(recipes)} recipes finished.",
        f"Training data: shapes seed {DATA_SEED} (size per recipe); every figure is on the val "
        f"split of shapes seed {SELECTION_SEED} ({SELECTION_IMAGES} images), metric w2, one "
        "training seed (0): a screen for recipes, not a result (see docs/results.md).",
        "",
        "| recipe | images | best/run epochs | train min | t2i P@1 single object | t2i P@1 "
        "| i2t P@1 | t2i R-P | i2t R-P | t2i PMRP | i2t PMRP |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        *[row(r) for r in results],
        "",
        "Recipes (changes to probsearch.demo.demo_model):",
        *[
            f"- {r.name}: images {r.images}, model {r.model}, training {r.training}"
            for r in recipes
        ],
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipes", default="", help="comma list of RECIPES names (default: all)")
    parser.add_argument("--work-dir", type=Path, default=ROOT / "runs" / "recipe_sweep")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/recipe_sweep.md")
    parser.add_argument("--parallel", type=int, default=1, help="recipes trained at once")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per recipe")
    parser.add_argument("--smoke", action="store_true", help="1/20 of the images, 1 epoch")
    args = parser.parse_args()
    names = [n for n in args.recipes.split(",") if n]
    recipes = [r for r in RECIPES if not names or r.name in names]
    if args.smoke:
        recipes = [
            replace(r, images=r.images // 20, training={**r.training, "epochs": 1}) for r in recipes
        ]
    command = " ".join(["python benchmarks/recipe_sweep.py", *sys.argv[1:]])
    started, load = time.perf_counter(), os.getloadavg()[0]
    selection = dataset(
        args.work_dir, SELECTION_IMAGES // (20 if args.smoke else 1), SELECTION_SEED
    )
    for images in sorted({r.images for r in recipes}):
        dataset(args.work_dir, images, DATA_SEED)
    with ProcessPoolExecutor(args.parallel, mp_context=get_context("spawn")) as pool:
        futures = [
            pool.submit(run_recipe, r, args.work_dir, selection, args.threads) for r in recipes
        ]
        results = []
        for future in as_completed(futures):
            try:
                results.append(future.result())
            except Exception as exc:  # one broken recipe must not lose the others' results
                print(f"a recipe failed: {exc!r}", file=sys.stderr)
                continue
            write_table(args, command, recipes, results, load, time.perf_counter() - started)
    print(args.out.read_text())


if __name__ == "__main__":
    main()
