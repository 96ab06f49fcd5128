"""`probsearch ... --help` names the environment variable of every option that reads one.

Every setting is "flag, else PROBSEARCH_<NAME>" (models.command_line.settings_from), so the
variable is written in each option's help; the help must print it as written. Rich markup once
took "[env PROBSEARCH_MODEL]" for a style tag and printed "Model dir ." (issue 42)."""

import inspect

import pytest
import typer
from typer.testing import CliRunner

from probsearch.cli import app

ROOT = typer.main.get_command(app)
# The options (or arguments) of each command whose value falls back to an environment variable.
ROOT_REDIS = {"--index-root": "PROBSEARCH_INDEX_ROOT", "--redis-url": "PROBSEARCH_REDIS_URL"}
ENVIRONMENT = {
    ("train",): {"--out": "PROBSEARCH_MODEL"},
    ("export",): {"model_dir": "PROBSEARCH_MODEL"},
    ("eval",): {"--model": "PROBSEARCH_MODEL", "--device": "PROBSEARCH_DEVICE"},
    ("reindex",): {"--model": "PROBSEARCH_MODEL", **ROOT_REDIS},
    ("index", "list"): ROOT_REDIS,
    ("index", "activate"): ROOT_REDIS,
    ("index", "rollback"): ROOT_REDIS,
    ("index", "gc"): ROOT_REDIS,
    ("index", "add"): {"--model": "PROBSEARCH_MODEL", **ROOT_REDIS},
    ("index", "delete"): ROOT_REDIS,
    ("index", "compact"): ROOT_REDIS,
    ("calibrate",): {
        "--model": "PROBSEARCH_MODEL",
        "--mc-samples": "PROBSEARCH_MC_SAMPLES",
        **ROOT_REDIS,
    },
    ("serve",): {
        "--model": "PROBSEARCH_MODEL",
        "--host": "PROBSEARCH_HOST",
        "--port": "PROBSEARCH_PORT",
        "--workers": "PROBSEARCH_WORKERS",
        **ROOT_REDIS,
    },
    ("demo",): {
        "--host": "PROBSEARCH_HOST",
        "--port": "PROBSEARCH_PORT",
        "--redis-url": "PROBSEARCH_REDIS_URL",
    },
}
# What a command body calls when it reads settings from the environment.
READS_SETTINGS = ("settings_from(", "_registry(", "Settings(")


def commands(group=ROOT, path: tuple[str, ...] = ()):
    """(path, command) of every leaf command under `group`."""
    for name, command in group.commands.items():
        if hasattr(command, "commands"):  # a group (typer vendors its own click)
            yield from commands(command, (*path, name))
        else:
            yield (*path, name), command


ALL = dict(commands())


def help_text(path: tuple[str, ...]) -> str:
    result = CliRunner().invoke(app, [*path, "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    return result.output


def entry(help_output: str, name: str) -> str:
    """The help of one option or argument: its line and the more indented lines under it."""
    lines = help_output.splitlines()
    for i, line in enumerate(lines):
        words = line.replace(",", " ").split()
        if words and name in words[:3]:
            indent = len(line) - len(line.lstrip())
            block = [line]
            for following in lines[i + 1 :]:
                if not following.strip() or len(following) - len(following.lstrip()) <= indent:
                    break
                block.append(following)
            return " ".join(block)
    raise AssertionError(f"{name} is not in the help:\n{help_output}")


def test_the_table_names_existing_commands_and_every_command_that_reads_settings() -> None:
    assert set(ENVIRONMENT) <= set(ALL), set(ENVIRONMENT) - set(ALL)
    for path, command in ALL.items():
        source = inspect.getsource(command.callback)
        if any(call in source for call in READS_SETTINGS):
            assert path in ENVIRONMENT, f"{' '.join(path)} reads settings: list its variables"


@pytest.mark.parametrize("path", sorted(ENVIRONMENT), ids=" ".join)
def test_help_names_the_environment_variable_of_every_option(path: tuple[str, ...]) -> None:
    shown = help_text(path)
    for name, variable in ENVIRONMENT[path].items():
        assert variable in entry(shown, name), f"{' '.join(path)} {name}:\n{shown}"


@pytest.mark.parametrize("path", sorted(ALL), ids=" ".join)
def test_bracketed_help_text_is_printed_as_written(path: tuple[str, ...]) -> None:
    # "[env ...]" and "[default: ...]" in a help string are text, not markup.
    shown = " ".join(help_text(path).split())
    for param in ALL[path].params:
        written = " ".join((getattr(param, "help", None) or "").split())
        if "[" in written:
            assert written in shown, f"{' '.join(path)}: {written!r} not in:\n{shown}"
