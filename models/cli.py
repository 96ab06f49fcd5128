"""Subcommands of the model stage: train, export (and the dataset and evaluation groups)."""

import typer

app = typer.Typer(no_args_is_help=True)
