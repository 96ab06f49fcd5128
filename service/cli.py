"""The `probsearch` console script: one root command that mounts each stage's subcommands."""

import typer

from indexer.cli import app as indexer_app
from models.cli import app as models_app
from models.datasets.cli import app as data_app
from models.evaluation_cli import eval_command
from service.commands import app as service_app

app = typer.Typer(
    name="probsearch",
    help="Uncertainty-aware image <-> text retrieval with Gaussian embeddings.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.add_typer(models_app)
app.add_typer(data_app, name="data", help="Generate or check datasets.")
app.command("eval")(eval_command)
app.add_typer(indexer_app)
app.add_typer(service_app)


def main() -> None:
    """Entry point of the `probsearch` console script."""
    app()
