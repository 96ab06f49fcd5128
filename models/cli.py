"""Subcommands of the model stage: train, export (and the dataset and evaluation groups)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from models.command_line import EXIT_BAD_INPUT, EXIT_FAILED, fail, required, settings_from
from models.networks.model_config import ModelConfig, TrainConfig

DEFAULT_MODEL = ModelConfig()
DEFAULT_TRAINING = TrainConfig()

app = typer.Typer(no_args_is_help=True)


@app.command()
def train(
    data: Annotated[
        Path,
        typer.Option(
            help="dataset dir (dataset.json, images.jsonl, "
            "captions.jsonl) with train and val splits"
        ),
    ],
    out: Annotated[
        Path | None, typer.Option(help="model dir to write (default: PROBSEARCH_MODEL)")
    ] = None,
    model_type: Annotated[str, typer.Option(help="gcie | gce | gie | vse | pvse")] = "gcie",
    metric: Annotated[
        str,
        typer.Option(
            help="training similarity; default: w2 (gcie), mahalanobis (gce, gie), cosine (vse)"
        ),
    ] = "",
    image_query_metric: Annotated[
        str,
        typer.Option(
            help="metric the service ranks captions with for an image query that names none "
            "(default: the training metric's)"
        ),
    ] = "",
    covariance: Annotated[
        str, typer.Option(help="ellipsoidal | spherical-avgpool | spherical-one-value")
    ] = "ellipsoidal",
    objective: Annotated[
        str,
        typer.Option(
            help="hinge (triplet on -distance) | pcme (sampled match probability) | pcmepp "
            "(closed-form sampled distance, pseudo-positives)"
        ),
    ] = DEFAULT_TRAINING.objective,
    variance_objective: Annotated[
        str,
        typer.Option(
            help="'' | spread (each variance = the spread of the item's plausible matches) | "
            "pcmepp (PCME++ on the detached means)"
        ),
    ] = DEFAULT_TRAINING.variance_objective,
    variance_reads_only: Annotated[
        bool,
        typer.Option(help="the variance head reads the trunk's features without training them"),
    ] = DEFAULT_MODEL.variance_reads_only,
    positives: Annotated[
        str,
        typer.Option(
            help="pairs (own captions only) | plausible (no plausible pair is a negative) | "
            "plausible_images (no image a caption plausibly describes is its negative)"
        ),
    ] = DEFAULT_TRAINING.positives,
    vib_beta: Annotated[
        float, typer.Option(help="weight of KL(N(mu, sigma^2) || N(0, I)) per Gaussian modality")
    ] = DEFAULT_TRAINING.vib_beta,
    uniformity_weight: Annotated[
        float, typer.Option(help="weight of the uniformity loss on the means")
    ] = DEFAULT_TRAINING.uniformity_weight,
    match_samples: Annotated[
        int, typer.Option(help="J of PCME's J x J sampled match probability")
    ] = DEFAULT_TRAINING.match_samples,
    pseudo_positive_weight: Annotated[
        float, typer.Option(help="PCME++ weight of the pseudo-positive loss")
    ] = DEFAULT_TRAINING.pseudo_positive_weight,
    epochs: Annotated[
        int, typer.Option(help="at most this many epochs (with --resume: up to this)")
    ] = DEFAULT_TRAINING.epochs,
    patience: Annotated[
        int,
        typer.Option(
            help="stop after this many epochs without a better validation score (0: never)"
        ),
    ] = DEFAULT_TRAINING.patience,
    batch_size: Annotated[
        int, typer.Option(help="images per batch, each with its captions")
    ] = DEFAULT_TRAINING.batch_size,
    lr: Annotated[
        float, typer.Option(help="Adam learning rate (x0.1 when validation stops improving)")
    ] = DEFAULT_TRAINING.lr,
    embed_dim: Annotated[int, typer.Option(help="embedding dimension D")] = DEFAULT_MODEL.embed_dim,
    margin: Annotated[float, typer.Option(help="hinge margin")] = DEFAULT_TRAINING.margin,
    negatives: Annotated[
        str,
        typer.Option(
            help="sum (all violating negatives) | hardest (VSE++ max violation, after one epoch "
            "of sum)"
        ),
    ] = DEFAULT_TRAINING.negatives,
    dropout: Annotated[
        float, typer.Option(help="MC-dropout probability p")
    ] = DEFAULT_MODEL.dropout,
    var_min: Annotated[
        float, typer.Option(help="lower safety bound of the variance")
    ] = DEFAULT_MODEL.var_min,
    var_max: Annotated[
        float, typer.Option(help="upper safety bound of the variance")
    ] = DEFAULT_MODEL.var_max,
    num_embeds: Annotated[
        int, typer.Option(help="pvse: K embeddings per item")
    ] = DEFAULT_MODEL.num_embeds,
    cnn_downsample: Annotated[
        str, typer.Option(help="stride (stride-2 convs) | maxpool (full-resolution convs)")
    ] = DEFAULT_MODEL.cnn_downsample,
    stem_stride: Annotated[
        int, typer.Option(help="stride of the first conv (1 keeps the full resolution)")
    ] = DEFAULT_MODEL.stem_stride,
    image_pooling: Annotated[
        str, typer.Option(help="grid (flattened 4x4 map) | objects (plus per-cell detectors)")
    ] = DEFAULT_MODEL.image_pooling,
    label_weight: Annotated[
        float, typer.Option(help="weight of the auxiliary loss on the dataset's image labels")
    ] = DEFAULT_TRAINING.label_weight,
    attribute_weight: Annotated[
        float,
        typer.Option(
            help="weight of the auxiliary loss that reads each image's object attributes "
            "(shapes, colours, sizes) off its trunk features"
        ),
    ] = DEFAULT_TRAINING.attribute_weight,
    outlier_fraction: Annotated[
        float,
        typer.Option(help="synthetic outlier images per real image of a batch (0 = none)"),
    ] = DEFAULT_TRAINING.outlier_fraction,
    outlier_ranking_weight: Annotated[
        float,
        typer.Option(
            help="weight of ranking each synthetic outlier's image log-det above every real "
            "image's (outlier exposure; needs --outlier-fraction; 0 = off)"
        ),
    ] = DEFAULT_TRAINING.outlier_ranking_weight,
    counterfactual_weight: Annotated[
        float,
        typer.Option(help="weight of ranking each pair above its swapped counterparts (0 = off)"),
    ] = DEFAULT_TRAINING.counterfactual_weight,
    counterfactuals: Annotated[
        str,
        typer.Option(
            help="what the counterfactual weight applies to: captions (a shape, colour or size "
            "word swapped), images (one object's shape swapped; shapes data only) or both"
        ),
    ] = DEFAULT_TRAINING.counterfactuals,
    caption_swaps: Annotated[
        str,
        typer.Option(help="which words swapped captions change: some of shape,color,size"),
    ] = DEFAULT_TRAINING.caption_swaps,
    div_weight: Annotated[
        float, typer.Option(help="pvse: weight of the diversity loss")
    ] = DEFAULT_TRAINING.div_weight,
    mmd_weight: Annotated[
        float, typer.Option(help="pvse: weight of the MMD loss")
    ] = DEFAULT_TRAINING.mmd_weight,
    seed: Annotated[int, typer.Option()] = DEFAULT_TRAINING.seed,
    resume: Annotated[bool, typer.Option(help="continue the run saved in --out")] = False,
    progress: Annotated[bool, typer.Option(help="show a progress bar")] = True,
) -> None:
    """Train the encoders on DATA and write a model dir with ONNX encoders."""
    from models.datasets.records import DatasetError
    from models.networks.model_config import ConfigError
    from models.onnx.export import ExportError
    from models.threads import configure_torch_threads
    from models.training.train import train as run_training
    from models.training.training_data import TrainingDataError

    started = time.perf_counter()
    settings = settings_from({"model": out})
    out = required(settings, "model", "--out", "no model dir")
    configure_torch_threads(settings.threads)
    try:
        model_config = ModelConfig(
            model_type=model_type,
            metric=metric,
            image_query_metric=image_query_metric,
            covariance=covariance,
            embed_dim=embed_dim,
            dropout=dropout,
            var_min=var_min,
            var_max=var_max,
            variance_reads_only=variance_reads_only,
            num_embeds=num_embeds,
            cnn_downsample=cnn_downsample,
            stem_stride=stem_stride,
            image_pooling=image_pooling,
        )
        train_config = TrainConfig(
            epochs=epochs,
            patience=patience,
            batch_size=batch_size,
            lr=lr,
            objective=objective,
            variance_objective=variance_objective,
            positives=positives,
            margin=margin,
            negatives=negatives,
            vib_beta=vib_beta,
            uniformity_weight=uniformity_weight,
            match_samples=match_samples,
            pseudo_positive_weight=pseudo_positive_weight,
            div_weight=div_weight,
            mmd_weight=mmd_weight,
            label_weight=label_weight,
            attribute_weight=attribute_weight,
            outlier_fraction=outlier_fraction,
            outlier_ranking_weight=outlier_ranking_weight,
            counterfactual_weight=counterfactual_weight,
            counterfactuals=counterfactuals,
            caption_swaps=caption_swaps,
            seed=seed,
        )
        result = run_training(
            data, out, model_config, train_config, resume=resume, progress=progress, log=typer.echo
        )
    except (ConfigError, DatasetError, TrainingDataError) as e:
        raise fail(str(e), EXIT_BAD_INPUT) from None
    except ExportError as e:
        raise fail(str(e), EXIT_FAILED) from None
    recalls = "  ".join(f"{k} {v:.1f}" for k, v in result.best_recalls.items())
    typer.echo(f"best epoch {result.best_epoch}: {recalls}")
    typer.echo(
        f"wrote {out} in {time.perf_counter() - started:.1f}s "
        f"(ONNX parity {max(result.onnx_max_difference.values(), default=0.0):.1e})"
    )


@app.command()
def export(
    model_dir: Annotated[
        Path | None,
        typer.Argument(
            help="model dir holding model.json and checkpoint.pt (default: PROBSEARCH_MODEL)"
        ),
    ] = None,
) -> None:
    """Export both encoders of MODEL_DIR to ONNX and check them against torch."""
    from models.networks.model_config import ConfigError
    from models.onnx.export import ExportError, export_model_dir

    model_dir = required(settings_from({"model": model_dir}), "model", "MODEL_DIR", "no model dir")
    try:
        differences = export_model_dir(model_dir)
    except ConfigError as e:
        raise fail(str(e), EXIT_BAD_INPUT) from None
    except ExportError as e:
        raise fail(str(e), EXIT_FAILED) from None
    for name, difference in differences.items():
        typer.echo(f"wrote {model_dir / name} (max |torch - onnxruntime| = {difference:.1e})")
