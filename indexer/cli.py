"""Subcommands of the index stage: reindex and index list|activate|rollback|gc."""

import typer

app = typer.Typer(no_args_is_help=True)
