"""GPU FAISS check: each index type the indexer builds, searched where the service would put it
(indexer.read_index.to_device, `device="auto"`), against the same index on the CPU.

For every index type and family: build it with indexer.build on seeded synthetic Gaussians (with
a share of duplicate embeddings, so flat and HNSW indexes are IndexIDMap-wrapped as a reindex
wraps them), place it as the service does (read_index.place_family: a GPU copy, with the CPU
original kept for searches among selected rows), and search through read_index.FamilyIndex,
the service's shortlist, with the family's search parameters:
- unfiltered: do the two return the same rows, and how far apart are their distances?
- filtered (a RowSelection of a third of the rows, as a metadata filter or a live gallery's
  deletions make): does the GPU copy answer, and with the CPU's rows?
- speed: a batch of queries, and one query alone (median).
The bare GPU copies (FAISS's own GPU code; cuVS, where the build has it) are searched too, their
filtered searches included, to show why those stay on the CPU. Writes a Markdown file to
--out. Where FAISS sees no GPU it says so and runs the CPU alone.

    python benchmarks/gpu_faiss_check.py --n 200000 --out gpu_faiss_check.md
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import traceback
from pathlib import Path

import faiss
import numpy as np
from result_header import result_header, write_results

from indexer.build import build_family_index, duplicate_representatives, plan_index
from indexer.read_index import DuplicateGroups, FamilyIndex, RowSelection, place_family

SEARCH_PARAMS = {"ivf": {"nprobe": 32}, "ivfsq": {"nprobe": 32}, "ivfpq": {"nprobe": 32},
                 "hnsw": {"efSearch": 128}}  # fmt: skip
LONE_REPEATS = 50


def gallery(n: int, dim: int, duplicate_share: float, seed: int) -> tuple[np.ndarray, ...]:
    """mu ~ N(0, 1), logvar ~ U(-3, 0) (N, D) float32; the last `duplicate_share` of the rows
    repeat earlier rows' embeddings."""
    rng = np.random.default_rng(seed)
    mu = rng.standard_normal((n, dim)).astype(np.float32)
    logvar = rng.uniform(-3.0, 0.0, (n, dim)).astype(np.float32)
    copies = int(n * duplicate_share)
    source = rng.integers(0, n - copies, copies)
    mu[n - copies :], logvar[n - copies :] = mu[source], logvar[source]
    queries = rng.standard_normal((256, dim)).astype(np.float32)
    query_logvar = rng.uniform(-3.0, 0.0, (256, dim)).astype(np.float32)
    return mu, logvar, queries, query_logvar


def agreement(cpu: tuple[np.ndarray, np.ndarray], gpu: tuple[np.ndarray, np.ndarray]) -> dict:
    """Share of queries with the same row set, mean overlap of the sets, largest relative
    distance gap on the rows both returned."""
    (d_cpu, r_cpu), (d_gpu, r_gpu) = cpu, gpu
    same, overlap, gap = 0, [], 0.0
    for q in range(len(r_cpu)):
        a, b = set(r_cpu[q][r_cpu[q] >= 0]), set(r_gpu[q][r_gpu[q] >= 0])
        same += a == b
        overlap.append(len(a & b) / max(len(a), 1))
        for row in a & b:
            x = float(d_cpu[q][r_cpu[q] == row][0])
            y = float(d_gpu[q][r_gpu[q] == row][0])
            gap = max(gap, abs(x - y) / (1.0 + abs(x)))
    return {"same": same / len(r_cpu), "overlap": float(np.mean(overlap)), "gap": gap}


def timed(search, queries: np.ndarray, query_logvar: np.ndarray) -> tuple[float, float]:
    """(batch ms per query, lone query median ms)."""
    search(queries[:8], query_logvar[:8])
    start = time.perf_counter()
    search(queries, query_logvar)
    batch = (time.perf_counter() - start) * 1000 / len(queries)
    lone = []
    for q in range(LONE_REPEATS):
        start = time.perf_counter()
        search(queries[q : q + 1], query_logvar[q : q + 1])
        lone.append((time.perf_counter() - start) * 1000)
    return batch, statistics.median(lone)


def gpu_copies(index: faiss.Index) -> dict[str, faiss.Index]:
    """The index copied to the GPUs by FAISS's own GPU code and, in a cuVS build, by cuVS
    (a cuVS build's default for the types cuVS implements)."""
    copies = {}
    for label, cuvs in (("GPU, FAISS code", False), ("GPU, cuVS", True)):
        options = faiss.GpuMultipleClonerOptions()
        if hasattr(options, "use_cuvs"):
            options.use_cuvs = cuvs
        elif cuvs:
            continue
        copies[label] = faiss.index_cpu_to_all_gpus(index, co=options)
    return copies


def filtered_search(searcher: FamilyIndex, data: tuple, k: int, allowed: RowSelection):
    """(the answer, how it went) of a search among the `allowed` rows: "answers" and how many
    excluded rows it returned, or (None, why it failed)."""
    try:
        distances, rows = searcher.search(data[2], data[3], k, allowed=allowed)
    except RuntimeError as e:  # the check reports what the GPU refuses
        traceback.print_exc()
        return None, f"fails: {type(e).__name__}: {str(e).splitlines()[0][:120]}"
    excluded = int((~allowed.allowed[rows[rows >= 0]]).sum())
    return (distances, rows), f"answers, {excluded} excluded rows returned"


def check(index_type: str, family: str, data: tuple, k: int, gpu: bool) -> list[str]:
    """One table row per searcher: the CPU index; where a GPU is seen, the service's
    (place_family: the GPU copy, filtered searches on the CPU original) and the bare GPU
    copies of gpu_copies, filtered searches and all."""
    mu, logvar, queries, query_logvar = data
    representatives = duplicate_representatives(mu, logvar)
    groups = DuplicateGroups(representatives) if representatives is not None else None
    plan = plan_index(index_type, len(mu), mu.shape[1], (family,), 2**40)
    start = time.perf_counter()
    index, params = build_family_index(family, mu, logvar, plan, duplicates=groups)
    built = f"{time.perf_counter() - start:.1f}"
    allowed = RowSelection(np.random.default_rng(1).random(len(mu)) < 1 / 3)
    search_params = SEARCH_PARAMS.get(index_type, {})
    searchers = {"cpu": FamilyIndex(family, index, params, search_params, groups)}
    if gpu:
        searchers["auto (served)"] = place_family(
            family, index, "auto", params, search_params, groups
        )
        for label, copy in gpu_copies(index).items():
            searchers[label] = FamilyIndex(family, copy, params, search_params, groups)
    reference, rows = None, []
    for device, searcher in searchers.items():
        answer = searcher.search(queries, query_logvar, k)
        filtered, how = filtered_search(searcher, data, k, allowed)
        batch, lone = timed(lambda m, v, s=searcher: s.search(m, v, k), queries, query_logvar)
        where = type(faiss.downcast_index(searcher.index)).__name__
        row = [index_type, family, device, where, built, f"{batch:.3f}", f"{lone:.3f}"]
        if reference is None:
            reference = answer, filtered
            rows.append([*row, "(reference)", "", "", how])
            continue
        if filtered is not None:
            how += f", same rows {agreement(reference[1], filtered)['same']:.0%}"
        same = agreement(reference[0], answer)
        figures = [f"{same['same']:.0%}", f"{same['overlap']:.3f}", f"{same['gap']:.1e}"]
        rows.append([*row, *figures, how])
    return ["| " + " | ".join(r) + " |" for r in rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200_000, help="gallery rows")
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--k", type=int, default=100, help="shortlist size")
    parser.add_argument("--types", default="flat,ivf,ivfsq,ivfpq,hnsw")
    parser.add_argument("--families", default="w2,kl")
    parser.add_argument("--duplicate-share", type=float, default=0.05)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    started, load = time.perf_counter(), os.getloadavg()
    gpus = faiss.get_num_gpus() if hasattr(faiss, "get_num_gpus") else 0
    data = gallery(args.n, args.dim, args.duplicate_share, seed=0)
    table = []
    for index_type in args.types.split(","):
        for family in args.families.split(","):
            table += check(index_type, family, data, args.k, gpus > 0)
            print(table[-1], flush=True)
    lines = result_header("GPU FAISS check: to_device's copy against the CPU index", load, started)
    lines += [
        "",
        f"faiss {faiss.__version__}, GPUs seen: {gpus}; FAISS CPU threads:"
        f" {faiss.omp_get_max_threads()}.",
        f"Gallery: {args.n} synthetic Gaussians, D={args.dim}, {args.duplicate_share:.0%} duplicate"
        f" embeddings; 256 queries, shortlist k={args.k}; search parameters {SEARCH_PARAMS}."
        " Filtered: a RowSelection of a third of the rows; 'excluded rows returned' counts rows"
        " outside it in the answer. Agreement: share of queries with the"
        " CPU's row set, mean overlap of the sets, largest |a - b| / (1 + |a|) of their distances.",
        "",
        "| type | family | device | FAISS index | build s | batch ms/query | lone query ms"
        " | same rows | overlap | distance gap | filtered search |",
        "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
        *table,
    ]
    write_results(args.out, lines)


if __name__ == "__main__":
    main()
