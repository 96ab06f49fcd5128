"""The image heads' principal-component fit (models.networks.principal_components) on the demo's
training drawings: seconds and captured variance of the shipped float32 fit against the same
randomised fit in float64 and against the exact components (the Gram matrix's eigenvectors).

Captured variance: the share of the centred vectors' squared norm that their projection onto
the K fitted directions keeps; the exact components keep the most any K directions can.

    .venv/bin/python benchmarks/pca_fit.py --data .cache/demo/data \\
        --out benchmarks/results/pca_fit.md
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from result_header import result_header, write_results

from models.networks.principal_components import (
    FIT_SEED,
    OVERSAMPLING,
    POWER_ITERATIONS,
    PrincipalComponents,
)

FEATURES = "features/efficientnet-lite0-style-*/train-image.npz"


def shipped(x: torch.Tensor, k: int) -> torch.Tensor:
    pca = PrincipalComponents(x.shape[1], k)
    pca.fit(x)
    return pca.basis.double()


def float64(x: torch.Tensor, k: int) -> torch.Tensor:
    """The fit as it was before it moved to float32."""
    centred = x.double() - x.double().mean(dim=0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(FIT_SEED)
        _, _, v = torch.pca_lowrank(
            centred, q=k + OVERSAMPLING, center=False, niter=POWER_ITERATIONS
        )
    return v[:, :k]


def exact(x: torch.Tensor, k: int) -> torch.Tensor:
    centred = x.double() - x.double().mean(dim=0)
    values, vectors = torch.linalg.eigh(centred @ centred.T)
    top = values.flip(0)[:k].clamp_min(1e-12).sqrt()
    return (centred.T @ vectors.flip(1)[:, :k]) / top


FITS = {"float32 (shipped)": shipped, "float64 (before)": float64, "exact": exact}


def captured(x: torch.Tensor, basis: torch.Tensor) -> float:
    centred = x.double() - x.double().mean(dim=0)
    return float(((centred @ basis) ** 2).sum() / (centred**2).sum())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path(".cache/demo/data"))
    parser.add_argument("--components", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    started, load = time.perf_counter(), os.getloadavg()
    path = next(args.data.glob(FEATURES))
    with np.load(path) as stored:
        x = torch.from_numpy(stored["features"])
    seconds: dict[str, list[float]] = {name: [] for name in FITS}
    share = {}
    for round_ in range(args.rounds):
        for name in list(FITS) if round_ % 2 == 0 else list(FITS)[::-1]:
            start = time.perf_counter()
            basis = FITS[name](x, args.components)
            seconds[name].append(time.perf_counter() - start)
            share[name] = captured(x, basis)
            print(round_, name, f"{seconds[name][-1]:.1f} s", flush=True)
    lines = result_header("The principal-component fit: float32, float64, exact", load, started)
    lines += [
        "",
        f"{x.shape[0]} x {x.shape[1]} training vectors ({path}), K = {args.components}, "
        f"torch threads {torch.get_num_threads()}, {args.rounds} rounds alternated.",
        "",
        "| fit | seconds (median) | each round | captured variance |",
        "| --- | --- | --- | --- |",
    ]
    for name in FITS:
        rounds = ", ".join(f"{s:.1f}" for s in seconds[name])
        lines.append(
            f"| {name} | {statistics.median(seconds[name]):.1f} | {rounds} | "
            f"{100 * share[name]:.3f}% |"
        )
    write_results(args.out, lines)


if __name__ == "__main__":
    main()
