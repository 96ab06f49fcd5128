"""The `probsearch` console script: one root command that mounts each stage's subcommands."""

import os

# OpenMP threads that spin while they wait steal the cores from everything else on a shared
# machine (a training step went from 0.07 s to 2.4 s); they must sleep instead. This has to be
# set before torch, ONNX Runtime or FAISS start their pools, hence here, first.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import typer

from indexer.cli import app as indexer_app
from models.allocator import keep_freed_memory
from models.cli import app as models_app
from models.datasets.cli import app as data_app
from models.evaluation.cli import eval_command
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


# faiss and onnxruntime come from the `cpu` or `gpu` extra, not from a plain install.
BACKENDS = {"faiss": "FAISS", "onnxruntime": "ONNX Runtime"}


def main() -> None:
    """Entry point of the `probsearch` console script."""
    keep_freed_memory()
    try:
        app()
    except ModuleNotFoundError as error:
        if error.name not in BACKENDS:
            raise
        typer.echo(
            f"error: {BACKENDS[error.name]} is not installed; install exactly one of the extras: "
            "pip install 'probsearch[cpu]' (CPU) or 'probsearch[gpu]' (NVIDIA GPU, CUDA 12)",
            err=True,
        )
        raise SystemExit(2) from None
