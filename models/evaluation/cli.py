"""`probsearch eval`: evaluate a model dir on a dataset split and write the report."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer

from models.command_line import fail
from models.distance.gaussian import UnknownMetricError
from models.evaluation.evaluate import (
    EvalConfig,
    EvaluationError,
    check_eval_metric,
    evaluate_model,
)
from models.evaluation.report import markdown_report, write_report
from models.settings import ProbsearchSettings
from models.threads import configure_torch_threads

app = typer.Typer(no_args_is_help=True)


@app.callback()
def main() -> None:
    """Evaluation of trained models."""


def _parse_list(text: str | None, kind: type, what: str) -> tuple:
    if not text:
        return ()
    try:
        return tuple(kind(item.strip()) for item in text.split(",") if item.strip())
    except ValueError as e:
        message = f"--{what} must be a comma-separated list of {kind.__name__}: {text!r}"
        raise fail(message, 2) from e


@app.command("eval")
def eval_command(
    data: Annotated[Path, typer.Option(help="Dataset dir (docs/data-format.md).")],
    model: Annotated[Path | None, typer.Option(help="Model dir [env PROBSEARCH_MODEL].")] = None,
    split: Annotated[str, typer.Option(help="train, val or test.")] = "test",
    metrics: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated distances, e.g. w2,kl,min_kl, or max_pair for pvse "
            "[default: the model's]."
        ),
    ] = None,
    report: Annotated[
        Path | None,
        typer.Option(help="Write report.json, report.md and PNG plots here (else print Markdown)."),
    ] = None,
    mc_samples: Annotated[int, typer.Option(help="MC-dropout draws (MI needs >= 2).")] = 10,
    seed: Annotated[int, typer.Option(help="Seed of the MC draws and tie-breaking.")] = 0,
    shortlist: Annotated[int, typer.Option(help="Top-m candidates MI is computed over.")] = 100,
    temperatures: Annotated[str, typer.Option(help="Comma-separated MI temperatures.")] = (
        "0.01,0.1,1,10"
    ),
    chunk_size: Annotated[int, typer.Option(help="Queries per distance chunk.")] = 256,
    ood: Annotated[
        Path | None,
        typer.Option(
            help="Folder of images unlike the dataset (e.g. `probsearch data photos`): AUROC "
            "of each score for telling them from the split's images."
        ),
    ] = None,
    device: Annotated[
        str | None, typer.Option(help="auto, cpu or cuda [env PROBSEARCH_DEVICE].")
    ] = None,
) -> None:
    """Plausible P@1, R-Precision, PMRP, R@K; rejection and ambiguity of every uncertainty score;
    dataset shift (--ood); the crop experiment."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    settings = ProbsearchSettings()
    configure_torch_threads(settings.threads)
    model_dir = model or settings.model
    if model_dir is None:
        raise fail("no model dir: pass --model MODEL_DIR or set PROBSEARCH_MODEL", 2)
    if ood is not None and not ood.is_dir():
        raise fail(f"--ood {ood} is not a folder of images", 2)
    if not model_dir.is_dir():
        raise fail(f"model dir {model_dir} does not exist (train one with `probsearch train`)", 1)
    metric_names = _parse_list(metrics, str, "metrics")
    try:
        for metric in metric_names:
            check_eval_metric(metric)
    except UnknownMetricError as e:
        raise fail(str(e), 2) from e
    try:
        config = EvalConfig(
            metrics=metric_names,
            mc_samples=mc_samples,
            seed=seed,
            shortlist_size=shortlist,
            temperatures=_parse_list(temperatures, float, "temperatures"),
            chunk_size=chunk_size,
            device=device or settings.device,
            ood_dir=str(ood) if ood else None,
        )
        result = evaluate_model(model_dir, data, split, config)
    except EvaluationError as e:
        raise fail(str(e), 2) from e
    except (ValueError, OSError) as e:  # dataset, model dir, image and math errors
        raise fail(str(e), 1) from e
    if report is None:
        typer.echo(markdown_report(result))
        return
    written = write_report(result, report)
    typer.echo(f"wrote {len(written)} files to {report}: {', '.join(p.name for p in written)}")
