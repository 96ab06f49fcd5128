"""`probsearch train`'s options are the fields of ModelConfig and TrainConfig annotated with
Option, plus the command's own: same names, types, defaults and help, none restated by hand."""

import typing
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.testing import CliRunner

from models.cli import CONFIGS, app, configs_from, option_fields, with_config_options
from models.networks.model_config import ModelConfig, TrainConfig

# train's options that are no config field
OWN_OPTIONS = {"data", "out", "resume", "progress", "features"}


def train_command(application: typer.Typer) -> Any:
    """The click command of `train` in a Typer app."""
    group = typer.main.get_command(application)
    return group.get_command(typer.Context(group), "train")


def _value_type(field: Any) -> type:
    """The type of a field's value: its default's, or for a None default (a value the config
    fills in itself) the declared type's other member (float of `float | None`)."""
    if field.default is not None:
        return type(field.default)
    config = next(c for c in CONFIGS if field.name in c.__dataclass_fields__)
    declared = typing.get_args(typing.get_type_hints(config)[field.name])
    return next(t for t in declared if t is not type(None))


def option_problems(command: Any, configs: tuple[type, ...]) -> list[str]:
    """What differs between the command's options and the option fields of `configs`."""
    params = {p.name: p for p in command.params if p.name != "help"}
    fields = {f.name: (f, option) for config in configs for f, option in option_fields(config)}
    extra = sorted(set(params) - set(fields) - OWN_OPTIONS)
    problems = [f"--{name} is no config field" for name in extra]
    problems += [f"field {n} is no option" for n in sorted(set(fields) - set(params))]
    for name in sorted(set(fields) & set(params)):
        (field, option), param = fields[name], params[name]
        offered = (param.opts[0], param.type_descriptor.annotation, param.default, param.help)
        wanted = (f"--{name.replace('_', '-')}", _value_type(field), field.default, option.help)
        if offered != wanted:
            problems.append(f"--{name}: {offered} != {wanted}")
    return problems


def test_train_offers_every_option_field_as_it_is() -> None:
    assert option_problems(train_command(app), CONFIGS) == []
    # 36, then the two backbones, the heads' width, the novelty bank, infonce's temperature
    # PCME++'s mixed samples and label smoothing, where the heads' variance reads, and the
    # match BCE's pair weighting, the text backbone's int8 weights, and the service's default
    # metric (search_with), the weights' moving average (ema_decay), AdamW's weight decay, the
    # image heads' principal components
    assert len([f for config in CONFIGS for f, _ in option_fields(config)]) == 50


def test_an_option_missing_from_the_dataclasses_fails_the_check() -> None:
    """A hand-written option beside the generated ones, or a config field the command does not
    offer, is reported."""
    extra = typer.Typer()

    @extra.command()
    @with_config_options(TrainConfig, after="out")
    def train(
        data: Annotated[Path, typer.Option()],
        out: Annotated[Path | None, typer.Option()] = None,
        warmup: Annotated[int, typer.Option(help="not a TrainConfig option")] = 1,
        **config: Any,
    ) -> None:
        """A train command with an option of its own."""

    extra.command("other")(lambda: None)  # a group, as the real app is
    problems = option_problems(train_command(extra), CONFIGS)
    assert "--warmup is no config field" in problems
    assert "field model_type is no option" in problems  # ModelConfig's fields are not offered


def test_the_help_lists_each_option_and_its_help() -> None:
    result = CliRunner().invoke(app, ["train", "--help"], env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    for config in CONFIGS:
        for field, option in option_fields(config):
            assert f"--{field.name.replace('_', '-')}" in result.output
            assert option.help is None or option.help in result.output


def test_the_defaults_of_the_options_build_the_default_configs() -> None:
    defaults = {f.name: f.default for config in CONFIGS for f, _ in option_fields(config)}
    assert configs_from(defaults) == (ModelConfig(), TrainConfig())
    changed = configs_from({**defaults, "embed_dim": 8, "lr": 0.1})
    assert (changed[0].embed_dim, changed[1].lr) == (8, 0.1)
