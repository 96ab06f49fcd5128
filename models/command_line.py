"""What every probsearch command shares: its settings as "flag, else environment", and an error
as one line on stderr with an exit code instead of a traceback."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError

from models.settings import Settings

EXIT_FAILED = 1
EXIT_BAD_INPUT = 2

# The options of every command that reads an index root, a model or Redis, each falling back
# to its PROBSEARCH_ variable (resolved by settings_from, not by click).
IndexRootOpt = Annotated[
    Path | None, typer.Option("--index-root", help="Index root [env PROBSEARCH_INDEX_ROOT].")
]
ModelOpt = Annotated[Path | None, typer.Option("--model", help="Model dir [env PROBSEARCH_MODEL].")]
RedisOpt = Annotated[
    str | None, typer.Option("--redis-url", help="Redis URL [env PROBSEARCH_REDIS_URL].")
]


def fail(message: str, code: int = EXIT_FAILED) -> typer.Exit:
    """Print `error: message` on stderr; returns the Exit to raise (`raise fail(...)`)."""
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


def one_line(error: Exception) -> str:
    """The error as one line: a settings ValidationError as `field: message; ...`."""
    if isinstance(error, ValidationError):
        return "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'settings'}: {e['msg']}" for e in error.errors()
        )
    return str(error)


def settings_from(flags: dict[str, Any]) -> Settings:
    """Settings from PROBSEARCH_* with the command's flags on top (None: not given); a value
    that is no valid setting fails with one line (exit 2)."""
    try:
        return Settings.with_flags(flags)
    except ValidationError as error:
        raise fail(one_line(error), EXIT_BAD_INPUT) from None


@contextlib.contextmanager
def bad_input_exits() -> Iterator[None]:
    """A ValueError or OSError raised in the block (a bad flag, file or setting found while
    the command works) ends the command with one line on stderr and exit 2."""
    try:
        yield
    except (ValueError, OSError) as error:
        raise fail(one_line(error), EXIT_BAD_INPUT) from None


def served_settings(flags: dict[str, Any]) -> Settings:
    """The settings of a command that reads a model and an index root (`serve`, `calibrate`):
    settings_from(flags) with the default paths filled in and both paths checked; a missing
    one fails with one line (exit 2)."""
    with bad_input_exits():
        settings = settings_from(flags).with_default_paths()
        check_served_paths(settings)
    return settings


def required(settings: Settings, name: str, option: str, what: str = "") -> Any:
    """settings.<name>, which its flag or PROBSEARCH_<NAME> set; when neither did, fails
    (exit 2) saying to pass `option` or set the variable (`what`: what is missing)."""
    value = getattr(settings, name)
    if value is None:
        what = what or f"{option} is required"
        raise fail(f"{what}: pass {option} or set PROBSEARCH_{name.upper()}", EXIT_BAD_INPUT)
    return value


def check_served_paths(settings: Settings) -> None:
    """ValueError unless settings.model holds a model and settings.index_root exists (what
    `serve` and `calibrate` read)."""
    if not (settings.model / "model.json").is_file():
        raise ValueError(
            f"model dir {settings.model} has no model.json: pass --model MODEL_DIR "
            "(a dir written by `probsearch train`) or set PROBSEARCH_MODEL"
        )
    if not settings.index_root.is_dir():
        raise ValueError(
            f"index root {settings.index_root} does not exist: pass --index-root or "
            "set PROBSEARCH_INDEX_ROOT (build one with `probsearch reindex`)"
        )
