"""The raw parts of one text query, timed in-process on the objects the server builds.

Run by benchmarks/service_bench.py in a process of its own with the server's environment
(PROBSEARCH_*), so the services come from the same settings: service.http.main.build_services, then
per query the ONNX encode with L draws, the FAISS shortlist, the exact re-rank
(models.scoring.rerank.exact_rerank), the uncertainty scores
(models.scoring.query_scores.shortlist_scores) and the metadata lookup of the top k, each
timed on its own, with nothing else (no HTTP, no batcher, no cache, no response model).
After each such query, the same caption goes through the whole Searcher.search_batch (the
parts plus the searcher's grouping, stacking, hit lists and outcome), so that the service's
time at one client splits into the parts, the searcher's bookkeeping and the rest (HTTP,
cache lookup, response).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from pathlib import Path

import faiss
import numpy as np
import torch
from load_generator import timed_caption

from models.scoring.query_scores import shortlist_scores
from models.scoring.rerank import exact_rerank
from models.settings import Settings
from service.http.main import build_services
from service.metrics import ServiceMetrics
from service.outcome import DEFAULT_TEMPERATURE
from service.searcher import GALLERY_OF_KIND, Query
from service.services import Services

PARTS = ("encode", "shortlist", "rerank", "uncertainty", "metadata")
DRAWS = (16, 0)
WARMUP = 20
BLOCK_WARMUP = 5
K = 10


def _services(spec: dict) -> Services:
    """The services the server builds from the spec's model, indexes and thread setting
    (build_services applies the serve thread budget)."""
    threads = None if spec["threads"] == "default" else int(spec["threads"])
    settings = Settings(
        model=Path(spec["model"]),
        index_root=Path(spec["index_root"]),
        galleries=["image"],
        threads=threads,
    )
    return build_services(settings, ServiceMetrics())


def time_parts(spec: dict) -> dict:
    """p50/p95 ms of each part and of their sum, per draw count; and the threads in use."""
    services = _services(spec)
    try:
        with services.holder.acquire("image") as loaded:
            result = {f"L={draws}": _time(services, loaded, spec, draws) for draws in DRAWS}
        options = services.encoders["text"].session.get_session_options()
        result["threads"] = {
            "torch": torch.get_num_threads(),
            "torch_interop": torch.get_num_interop_threads(),
            "faiss": faiss.omp_get_max_threads(),
            "onnx_intra_op": options.intra_op_num_threads,
        }
        return result
    finally:
        services.holder.stop()
        services.decoder.close()


class _TextQueries:
    """Times one text query at a time: its raw parts, then the whole searcher on it."""

    def __init__(self, services, loaded, captions: list[str], draws: int) -> None:
        self.encoder, self.searcher, self.index = (
            services.encoders["text"],
            services.searcher,
            loaded.index,
        )
        self.metric = self.searcher.default_metric("image")  # text queries search the image gallery
        self.shortlist_metric = self.searcher.shortlist_metric(self.metric)
        calibration = self.index.manifest.calibration.get(self.metric)
        self.temperature = calibration.temperature if calibration else DEFAULT_TEMPERATURE
        self.captions, self.draws = captions, draws
        self.params = self.searcher.params(GALLERY_OF_KIND["text"], k=K, mc_samples=draws)
        self.size = self.params.shortlist

    def time_one(self, i: int) -> tuple[np.ndarray, float]:
        """ms of each of PARTS for query i, and ms of Searcher.search_batch on its caption."""
        index, device, metric, draws = self.index, self.searcher.device, self.metric, self.draws
        caption = self.captions[i % len(self.captions)]
        t0 = time.perf_counter()
        out = self.encoder.encode_texts([timed_caption(caption, "raw", i)], draws, [i])
        mu, logvar = out.mu[0], out.logvar[0]  # (D,)
        t1 = time.perf_counter()
        rows = index.shortlist(self.shortlist_metric, mu[None], logvar[None], self.size)
        t2 = time.perf_counter()
        ranked = exact_rerank(
            metric, mu, logvar, index.mu, index.logvar, rows[0], self.size, device
        )
        t3 = time.perf_counter()
        query = tuple(torch.from_numpy(a).to(device)[None] for a in (mu, logvar))  # (1, D)
        mc = None
        if out.mc_mu is not None and draws > 0:
            mc = tuple(
                torch.from_numpy(np.ascontiguousarray(a)).to(device)
                for a in (out.mc_mu, out.mc_logvar)
            )  # (L, 1, D)
        candidates = (ranked.mu[None], ranked.logvar[None])
        shortlist_scores(
            metric, query, mc, candidates, self.temperature, out.identical_draws, True,
            ranked.distances[None],
        )  # fmt: skip
        t4 = time.perf_counter()
        index.metadata(ranked.rows[:K].tolist())
        t5 = time.perf_counter()
        text = timed_caption(caption, "searcher", i)
        search = Query("text", "image", self.params, i, text=text)
        (outcome,) = self.searcher.search_batch([search])
        t6 = time.perf_counter()
        if isinstance(outcome, Exception):
            raise outcome
        return np.diff([t0, t1, t2, t3, t4, t5]) * 1000, 1000 * (t6 - t5)


def _time(services, loaded, spec: dict, draws: int) -> dict:
    queries = _TextQueries(services, loaded, spec["captions"], draws)
    samples, searcher_ms = [], []
    for i in range(WARMUP + spec["iterations"]):
        parts, whole = queries.time_one(i)
        if i >= WARMUP:
            samples.append(parts)
            searcher_ms.append(whole)
    times = np.array(samples)  # (iterations, parts)
    total = times.sum(axis=1)
    return {
        "metric": queries.metric,
        "shortlist": queries.size,
        "parts_p50": dict(zip(PARTS, np.percentile(times, 50, axis=0).tolist(), strict=True)),
        "total_p50": float(np.percentile(total, 50)),
        "total_p95": float(np.percentile(total, 95)),
        "searcher_p50": float(np.percentile(searcher_ms, 50)),
    }


def serve_queries(spec: dict, lines: Iterable[str], reply: Callable[[str], None]) -> None:
    """Raw parts on request (benchmarks/service_bench_overhead.py): after "READY", each line
    "start count" times text queries start .. start+count-1 with 16 draws back to back, as
    time_parts does, and answers "<raw parts p50 ms> <whole searcher p50 ms>" over them (the
    first BLOCK_WARMUP of the block left out), so that the benchmark can take the raw parts in
    turn with its service cells."""
    services = _services(spec)
    try:
        with services.holder.acquire("image") as loaded:
            queries = _TextQueries(services, loaded, spec["captions"], DRAWS[0])
            for i in range(WARMUP):
                queries.time_one(10**7 + i)  # numbers the requested blocks do not use
            reply("READY")
            for line in lines:
                start, count = (int(x) for x in line.split())
                timed = [queries.time_one(start + i) for i in range(count)][BLOCK_WARMUP:]
                raw = np.percentile([parts.sum() for parts, _ in timed], 50)
                whole = np.percentile([whole for _, whole in timed], 50)
                reply(f"{raw:.6f} {whole:.6f}")
    finally:
        services.holder.stop()
        services.decoder.close()
