"""Subcommands of the model stage: train, export (and the dataset and evaluation groups)."""

from __future__ import annotations

import dataclasses
import inspect
import time
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from models.command_line import EXIT_BAD_INPUT, EXIT_FAILED, fail, required, settings_from
from models.networks.model_config import ModelConfig, Option, TrainConfig

T = TypeVar("T")

app = typer.Typer(no_args_is_help=True)
CONFIGS = (ModelConfig, TrainConfig)  # their fields annotated with Option are train's options


def option_fields(config: type) -> list[tuple[dataclasses.Field, Option]]:
    """The fields of a config dataclass that are options of train, with their Option: those
    annotated `Annotated[type, Option(help)]` (models.networks.model_config)."""
    hints = typing.get_type_hints(config, include_extras=True)
    found = []
    for field in dataclasses.fields(config):
        marks = [m for m in getattr(hints[field.name], "__metadata__", ()) if isinstance(m, Option)]
        found += [(field, mark) for mark in marks[:1]]
    return found


def config_options(*configs: type) -> list[inspect.Parameter]:
    """One keyword option per option field of the configs: --field-name, typed and defaulted
    like the field, with its help."""
    return [
        inspect.Parameter(
            field.name,
            inspect.Parameter.KEYWORD_ONLY,
            default=field.default,
            annotation=Annotated[_option_type(config, field), typer.Option(help=option.help)],
        )
        for config in configs
        for field, option in option_fields(config)
    ]


def _option_type(config: type, field: dataclasses.Field) -> Any:
    """The default's type (a Literal field is a str option), or the declared one (`float |
    None`) for a field whose default is None: a value the config fills in itself."""
    if field.default is not None:
        return type(field.default)
    return typing.get_type_hints(config)[field.name]


def with_config_options(
    *configs: type, after: str
) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """Add config_options(*configs) to a command's options, right after its option `after`;
    their values arrive in the command's **kwargs."""

    def add(command: Callable[..., T]) -> Callable[..., T]:
        signature = inspect.signature(command, eval_str=True)
        own = [p for p in signature.parameters.values() if p.kind is not p.VAR_KEYWORD]
        at = 1 + [p.name for p in own].index(after)
        parameters = [*own[:at], *config_options(*configs), *own[at:]]
        command.__signature__ = signature.replace(  # type: ignore[attr-defined]
            parameters=[p.replace(kind=p.KEYWORD_ONLY) for p in parameters]
        )
        return command

    return add


def configs_from(options: dict[str, Any]) -> tuple[ModelConfig, TrainConfig]:
    """The ModelConfig and TrainConfig that train's config options give."""
    model_config, train_config = (
        config(**{field.name: options[field.name] for field, _ in option_fields(config)})
        for config in CONFIGS
    )
    return model_config, train_config


@app.command()
@with_config_options(*CONFIGS, after="out")
def train(
    data: Annotated[
        Path,
        typer.Option(
            help="dataset dir (dataset.json, images.jsonl, "
            "captions.jsonl) with train and val splits"
        ),
    ],
    out: Annotated[
        Path | None, typer.Option(help="model dir to write [env PROBSEARCH_MODEL]")
    ] = None,
    resume: Annotated[bool, typer.Option(help="continue the run saved in --out")] = False,
    progress: Annotated[bool, typer.Option(help="show a progress bar")] = True,
    features: Annotated[
        Path | None,
        typer.Option(
            help="folder of your own backbone vectors (images.npy + images.ids.txt, or "
            "images.parquet with id and vector; the same for captions) to train the heads on"
        ),
    ] = None,
    **config: Any,
) -> None:
    """Train the encoders on DATA and write a model dir with ONNX encoders."""
    from models.datasets.records import DatasetError
    from models.networks.model_config import ConfigError
    from models.onnx.parity import ExportError
    from models.threads import configure_torch_threads
    from models.training.train import train as run_training
    from models.training.training_data import TrainingDataError

    started = time.perf_counter()
    settings = settings_from({"model": out})
    out = required(settings, "model", "--out", "no model dir")
    configure_torch_threads(settings.threads)
    try:
        model_config, train_config = configs_from(config)
        result = run_training(
            data, out, model_config, train_config, resume=resume, progress=progress,
            log=typer.echo, features=features,
        )  # fmt: skip
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
            help="model dir holding model.json and checkpoint.pt [env PROBSEARCH_MODEL]"
        ),
    ] = None,
) -> None:
    """Export both encoders of MODEL_DIR to ONNX and check them against torch."""
    from models.networks.model_config import ConfigError
    from models.onnx.export import export_model_dir
    from models.onnx.parity import ExportError

    model_dir = required(settings_from({"model": model_dir}), "model", "MODEL_DIR", "no model dir")
    try:
        differences = export_model_dir(model_dir)
    except ConfigError as e:
        raise fail(str(e), EXIT_BAD_INPUT) from None
    except ExportError as e:
        raise fail(str(e), EXIT_FAILED) from None
    for name, difference in differences.items():
        typer.echo(f"wrote {model_dir / name} (max |torch - onnxruntime| = {difference:.1e})")
