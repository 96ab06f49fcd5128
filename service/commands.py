"""Subcommands of the service stage: serve."""

import typer

app = typer.Typer(no_args_is_help=True)
