"""ONNX Runtime encoder shared by the indexer and the service: preprocessing, MC-dropout masks
from a seeded generator, and (mu, logvar, MC draws) for a batch."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np
from PIL import Image

from models.networks.backbone_tokenizer import caption_tokens, load_tokenizer
from models.networks.model_config import (
    IMAGE_HEADS_ONNX_FILE,
    IMAGE_ONNX_FILE,
    TEXT_HEADS_ONNX_FILE,
    TEXT_ONNX_FILE,
    TOKENIZER_FILE,
    VOCAB_FILE,
    ModelConfig,
)
from models.networks.preprocess import backbone_pixels, images_to_array
from models.networks.tokenizer import Tokenizer
from models.onnx import ENCODE_BATCH
from models.threads import ThreadBudget, thread_budget

if TYPE_CHECKING:
    import onnxruntime as ort

logger = logging.getLogger(__name__)

CUDA = "CUDAExecutionProvider"
CUDA_EXACT = (CUDA, {"use_tf32": "0"})
CPU = "CPUExecutionProvider"
# A graph call's fixed cost in padded tokens (chunk_bounds), chosen on the demo's train captions
# (batches of 4 and 16 with 16 draws; of 2, 4, 8 and 16 tokens, 8 was fastest at 16 and none
# differed at 4); benchmarks/results/text_chunks.md measures it on the test captions.
CALL_COST_TOKENS = 8.0


Seeds = int | Sequence[int]


class EncoderRuntimeError(ValueError):
    """The model dir, device or request cannot be served by this encoder."""


@dataclass
class Embeddings:
    """Encoder output for N items: deterministic mu/logvar (N, D) float32 and, when MC draws
    were requested, mc_mu/mc_logvar (L, N, D) float32."""

    mu: np.ndarray
    logvar: np.ndarray
    mc_mu: np.ndarray | None = None
    mc_logvar: np.ndarray | None = None
    # pvse encoders: the K unit embeddings, (N, K, D) and (L, N, K, D) for the MC draws
    embeddings: np.ndarray | None = None
    mc_embeddings: np.ndarray | None = None
    # The encoder has no dropout, so every draw is the deterministic embedding, repeated.
    identical_draws: bool = False
    # Image encoders of a model on pretrained backbones: each image's novelty (N,)
    # (models.networks.feature_novelty); None for other encoders.
    novelty: np.ndarray | None = None


def open_session(path: Path, options: ort.SessionOptions, device: str) -> ort.InferenceSession:
    """An ONNX Runtime session of the graph at `path` on `device` (choose_providers).

    ONNX Runtime falls back to the CPU when it lists the CUDA provider but cannot load it (its
    CUDA or cuDNN libraries are missing, or are of another CUDA major than the build's): that
    is an error for device "cuda" and a warning for "auto", never silent."""
    import onnxruntime as ort

    providers = choose_providers(device)
    session = ort.InferenceSession(str(path), options, providers=providers)
    if providers[0] != CPU and session.get_providers()[0] != CUDA:
        problem = (
            f"ONNX Runtime lists {CUDA} but could not start it for {Path(path).name} (are the CUDA "
            f"and cuDNN libraries this onnxruntime-gpu {ort.__version__} was built for "
            "installed?)"
        )
        if device == "cuda":
            raise EncoderRuntimeError(problem)
        logger.warning("%s; running it on the CPU", problem)
    return session


def choose_providers(device: str) -> list[str | tuple[str, dict[str, str]]]:
    """ORT providers for `device` ("auto", "cpu" or "cuda"); CUDA only when ORT lists it.

    CUDA runs without TF32: with ORT's default (TF32 on), an H100 moved drawings' embeddings
    by up to 1.2e-2 relative and changed 2.7% of their nearest neighbours against the CPU;
    without it, 1.6e-5 and none (benchmarks/results/gpu_encoder_check.md)."""
    import onnxruntime as ort

    available = ort.get_available_providers()
    if device == "cpu":
        return [CPU]
    if device == "cuda":
        if CUDA not in available:
            raise EncoderRuntimeError(
                "device 'cuda' requested but onnxruntime has no "
                f"CUDAExecutionProvider (available: {available}); "
                "install onnxruntime-gpu or use device 'auto'/'cpu'"
            )
        return [CUDA_EXACT, CPU]
    if device == "auto":
        return [CUDA_EXACT, CPU] if CUDA in available else [CPU]
    raise EncoderRuntimeError(f"unknown device {device!r}; choose auto, cpu or cuda")


def session_options(threads: ThreadBudget):
    """ONNX Runtime options sized by the budget: graph nodes run one after another (the
    encoders are chains), each on `threads.intra_op` threads."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads.intra_op
    options.inter_op_num_threads = threads.inter_op
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    return options


class OnnxEncoder:
    """One modality's encoder of a model dir, run by ONNX Runtime.

    `mc_samples` = L adds L Monte-Carlo dropout draws computed in the same graph call as the
    deterministic embedding. Each item's masks come from a numpy Generator of its own: `seed`
    is either one seed per item, so an item's draws do not depend on what else is in the batch
    (the service batches requests this way), or one int from which the items' seeds are
    spawned. The same inputs, L and seed give the same draws. A model trained without dropout
    has no randomness to draw: its L draws are the deterministic embedding repeated, without
    running the graph L more times (`Embeddings.identical_draws`). Inputs are encoded in chunks of
    at most `batch_size`: images every `batch_size`, captions sorted by length and cut where
    padding them to one length costs more than another call (`chunk_bounds`). `threads` sizes
    ONNX Runtime's pools (default: the batch role's budget for the CPUs of this process,
    models.threads; a command passes the budget its settings give); `workers` chunks run at
    once, each in a thread of its own (a batch job; the service's encoders have one worker,
    so a served batch's chunks run one after another in its thread). The chunks are the same
    whatever the count.

    A model on pretrained backbones runs its whole path (backbone, then heads) from images or
    captions, tokenised with its tokenizer.json; with `heads_only` it runs the heads alone on
    backbone vectors (encode_features), for a user who brings the backbone's vectors.
    """

    def __init__(
        self,
        model_dir: Path | str,
        modality: Literal["image", "text"],
        device: str = "auto",
        batch_size: int = ENCODE_BATCH,
        threads: ThreadBudget | None = None,
        heads_only: bool = False,
        workers: int = 1,
    ) -> None:

        if modality not in ("image", "text"):
            raise EncoderRuntimeError(f"unknown modality {modality!r}; choose image or text")
        self.model_dir = Path(model_dir)
        self.modality = modality
        self.config = ModelConfig.load(self.model_dir)
        self.embed_dim = self.config.embed_dim
        self.batch_size = batch_size
        self.workers = max(1, workers)
        # Read once: a query then calls nothing of model_config (docs/design.md section 9).
        self.pretrained = self.config.pretrained
        if heads_only and not self.pretrained:
            raise EncoderRuntimeError(
                f"{model_dir} has no backbone: its encoders take images and captions only"
            )
        self.heads_only = heads_only
        path = self.model_dir / _graph_file(modality, heads_only)
        if not path.is_file():
            raise EncoderRuntimeError(f"{path} not found: run `probsearch export {model_dir}`")
        self.tokenizer = self._tokenizer() if modality == "text" and not heads_only else None
        self.threads = threads or thread_budget("batch")
        self.session = open_session(path, session_options(self.threads), device)
        self.provider: str = self.session.get_providers()[0]
        names = {o.name for o in self.session.get_outputs()}
        self._outputs = ["mu", "logvar"] + [n for n in ("embeddings", "novelty") if n in names]
        self._mask_widths = {
            i.name: i.shape[-1] for i in self.session.get_inputs() if i.name.endswith("masks")
        }
        self._pixel_type = pixel_dtype(self.session.get_inputs()[0].type)
        logger.info("loaded %s encoder %s on %s", modality, path, self.provider)

    def _tokenizer(self):
        """The small encoders' vocabulary, or a pretrained text backbone's tokenizer.json."""
        if self.config.pretrained:
            return load_tokenizer(self.model_dir / TOKENIZER_FILE, self.config.max_caption_tokens)
        return Tokenizer.load(self.model_dir / VOCAB_FILE)

    @property
    def feature_dim(self) -> int:
        """Width of the backbone vectors encode_features takes (0 without a backbone)."""
        return self.config.backbone_dim(self.modality) if self.pretrained else 0

    def encode_features(
        self, features: np.ndarray, mc_samples: int = 0, seed: Seeds = 0
    ) -> Embeddings:
        """Embed backbone vectors (N, F) with the heads alone (an encoder made `heads_only`)."""
        if not self.heads_only:
            raise EncoderRuntimeError("load the encoder with heads_only=True to embed features")
        features = np.ascontiguousarray(features, dtype=np.float32)
        if features.ndim != 2 or features.shape[1] != self.feature_dim:
            raise EncoderRuntimeError(
                f"backbone vectors must be (N, {self.feature_dim}), got {features.shape}"
            )
        masks = self._masks(item_generators(seed, len(features)), "dropout_masks", mc_samples)
        return self._run({"features": features, "dropout_masks": masks}, len(features), mc_samples)

    def encode_texts(
        self, texts: Sequence[str], mc_samples: int = 0, seed: Seeds = 0
    ) -> Embeddings:
        """Tokenise and embed captions; see the class docstring for the MC draws."""
        if self.tokenizer is None:
            raise EncoderRuntimeError(
                "this is not a caption encoder; load one with modality='text'"
            )
        if self.pretrained:
            ids, attention = caption_tokens(self.tokenizer, texts)
            masks = self._masks(item_generators(seed, len(texts)), "dropout_masks", mc_samples)
            # Shortest first, so that each chunk of batch_size is padded to about its own length.
            order = np.argsort(attention.sum(axis=1), kind="stable")
            feeds = {"input_ids": ids[order], "attention_mask": attention[order],
                     "dropout_masks": masks[:, order]}  # fmt: skip
            return _in_order(self._run(feeds, len(texts), mc_samples), order)
        ids, lengths = self.tokenizer.encode_batch(texts, self.config.max_caption_tokens)
        rngs = item_generators(seed, len(texts))
        # Word masks are drawn at the longest caption length, so an item's draws do not depend
        # on the batch's padding, then cut to this batch's width.
        words = self._masks(rngs, "word_masks", mc_samples, self.config.max_caption_tokens)
        word_masks = np.ascontiguousarray(words[:, :, : ids.shape[1]])
        head_masks = self._masks(rngs, "head_masks", mc_samples)
        feeds = {
            "token_ids": ids,
            "lengths": lengths,
            "word_masks": word_masks,
            "head_masks": head_masks,
        }
        return self._run(feeds, len(texts), mc_samples)

    def encode_images(
        self, images: Sequence[Image.Image], mc_samples: int = 0, seed: Seeds = 0
    ) -> Embeddings:
        """Resize, normalise and embed images; see the class docstring for the MC draws."""
        if self.modality != "image" or self.heads_only:
            raise EncoderRuntimeError(
                "this is not an image encoder; load one with modality='image'"
            )
        masks = self._masks(item_generators(seed, len(images)), "dropout_masks", mc_samples)
        if self.pretrained:
            pixels = backbone_pixels(images, self.config.image_size, self._pixel_type)
            return self._run({"pixels": pixels, "dropout_masks": masks}, len(images), mc_samples)
        pixels = images_to_array(images, self.config)  # (N, 3, H, W)
        return self._run({"images": pixels, "dropout_masks": masks}, len(images), mc_samples)

    def _masks(
        self, rngs: Sequence[np.random.Generator], name: str, mc_samples: int, *middle: int
    ) -> np.ndarray:
        """(1 + L, N, *middle, width) float32: block 0 ones, blocks 1..L item i's draws; a
        deterministic model has the ones block only (its draws are not run, see _run)."""
        if mc_samples < 0:
            raise EncoderRuntimeError(f"mc_samples must be >= 0, got {mc_samples}")
        mc_samples = 0 if self.deterministic else mc_samples
        width = self._mask_widths[name]
        masks = np.ones((1 + mc_samples, len(rngs), *middle, width), dtype=np.float32)
        p = self.config.dropout
        if mc_samples:
            for item, rng in enumerate(rngs):
                keep = rng.random((mc_samples, *middle, width)) >= p  # (L, *middle, width)
                masks[1:, item] = keep.astype(np.float32) / np.float32(1.0 - p)
        return masks

    @property
    def deterministic(self) -> bool:
        """Whether the model has no dropout: its MC draws all equal the deterministic pass."""
        return self.config.dropout == 0

    def _run(self, feeds: dict[str, np.ndarray], batch: int, mc_samples: int) -> Embeddings:
        """Run the graph; a deterministic model runs the deterministic block only."""
        if not (mc_samples and self.deterministic):
            return self._run_blocks(feeds, batch, mc_samples)
        out = self._run_blocks(feeds, batch, 0)  # the masks hold the deterministic block only
        out.mc_mu, out.mc_logvar = _repeated(out.mu, mc_samples), _repeated(out.logvar, mc_samples)
        out.mc_embeddings = _repeated(out.embeddings, mc_samples)
        out.identical_draws = True
        return out

    def _run_blocks(self, feeds: dict[str, np.ndarray], batch: int, mc_samples: int) -> Embeddings:
        """Run the graph in chunks along N; split the draw-major output into its blocks."""
        draws, dim = 1 + mc_samples, self.embed_dim
        multi: list[np.ndarray] = []  # pvse: (S, n, K, D) per chunk
        novelty: list[np.ndarray] = []  # (n,) per chunk
        mu = np.empty((draws, batch, dim), dtype=np.float32)
        logvar = np.empty((draws, batch, dim), dtype=np.float32)
        for (start, stop), got in self._chunks(feeds, batch):
            mu[:, start:stop] = got["mu"].reshape(draws, stop - start, dim)  # from (S * n, D)
            logvar[:, start:stop] = got["logvar"].reshape(draws, stop - start, dim)
            if "embeddings" in got:
                multi.append(got["embeddings"].reshape(draws, stop - start, -1, dim))
            if "novelty" in got:
                novelty.append(got["novelty"])
        out = Embeddings(mu=mu[0], logvar=logvar[0])
        if novelty:
            out.novelty = np.concatenate(novelty)
        if mc_samples:
            out.mc_mu, out.mc_logvar = mu[1:], logvar[1:]
        if multi:
            embeddings = np.concatenate(multi, axis=1)  # (S, N, K, D)
            out.embeddings = embeddings[0]
            out.mc_embeddings = embeddings[1:] if mc_samples else None
        return out

    def _chunks(
        self, feeds: dict[str, np.ndarray], batch: int
    ) -> Iterator[tuple[tuple[int, int], dict[str, np.ndarray]]]:
        """((start, stop), outputs) of each chunk, in order: in this thread when there is one
        chunk or one worker (a served batch), else `workers` chunks at once."""
        bounds = self._bounds(feeds, batch)
        if self.workers == 1 or len(bounds) < 2:
            yield from ((bound, self._run_chunk(feeds, *bound)) for bound in bounds)
            return
        with ThreadPoolExecutor(min(self.workers, len(bounds))) as pool:
            outputs = pool.map(lambda bound: self._run_chunk(feeds, *bound), bounds)
            yield from zip(bounds, outputs, strict=True)

    def _bounds(self, feeds: dict[str, np.ndarray], batch: int) -> list[tuple[int, int]]:
        """Chunks of at most batch_size items: captions cut where padding them to one length
        costs more than another call (chunk_bounds; encode_texts sorts them by length, so the
        chunks are runs of similar lengths), images every batch_size."""
        if "attention_mask" in feeds:
            return chunk_bounds(feeds["attention_mask"].sum(axis=1), self.batch_size)
        if "lengths" in feeds:
            return chunk_bounds(feeds["lengths"], self.batch_size)
        return [
            (start, min(start + self.batch_size, batch))
            for start in range(0, batch, self.batch_size)
        ]

    def _run_chunk(
        self, feeds: dict[str, np.ndarray], start: int, stop: int
    ) -> dict[str, np.ndarray]:
        """The graph's outputs for items start:stop, padding trimmed."""
        chunk = {name: _slice_batch(name, array, start, stop) for name, array in feeds.items()}
        if "lengths" in chunk:  # trim padding to the chunk's longest caption
            width = int(chunk["lengths"].max())
            chunk["token_ids"] = chunk["token_ids"][:, :width]
            chunk["word_masks"] = chunk["word_masks"][:, :, :width]
        if "attention_mask" in chunk:
            width = int(chunk["attention_mask"].sum(axis=1).max())
            chunk["input_ids"] = chunk["input_ids"][:, :width]
            chunk["attention_mask"] = chunk["attention_mask"][:, :width]
        return dict(zip(self._outputs, self.session.run(self._outputs, chunk), strict=True))


def _in_order(out: Embeddings, order: np.ndarray) -> Embeddings:
    """`out` of items encoded in `order`, put back in the order they were given."""
    back = np.argsort(order)

    def items(array: np.ndarray | None, axis: int) -> np.ndarray | None:
        return None if array is None else np.take(array, back, axis=axis)

    return Embeddings(
        mu=items(out.mu, 0), logvar=items(out.logvar, 0), mc_mu=items(out.mc_mu, 1),
        mc_logvar=items(out.mc_logvar, 1), embeddings=items(out.embeddings, 0),
        mc_embeddings=items(out.mc_embeddings, 1), identical_draws=out.identical_draws,
        novelty=items(out.novelty, 0),
    )  # fmt: skip


def chunk_bounds(
    lengths: np.ndarray, most: int, call_cost: float = CALL_COST_TOKENS
) -> list[tuple[int, int]]:
    """(start, stop) of consecutive chunks covering items 0..n-1 in order, each of at most
    `most` items, with the fewest padded tokens (a chunk's size x its longest item's length)
    plus `call_cost` per chunk: an exact dynamic programme. Among equally cheap cuts the last
    chunk starts as late as it can, so equal lengths give chunks of `most` from the front.

    A graph call pads every caption to its longest, and a transformer's cost grows with the
    padded tokens: one long caption in a batch of short ones (the clip-art demo's captions
    have 9 tokens on average and up to 87) made them all cost as much as it does."""
    lengths = np.asarray(lengths, dtype=np.float64)
    count = len(lengths)
    best = np.zeros(count + 1)
    cut = np.zeros(count + 1, dtype=np.int64)
    for stop in range(1, count + 1):
        starts = np.arange(stop - 1, max(0, stop - most) - 1, -1)  # latest start first
        longest = np.maximum.accumulate(lengths[starts])  # of items start..stop-1
        costs = best[starts] + call_cost + (stop - starts) * longest
        pick = int(np.argmin(costs))
        best[stop], cut[stop] = costs[pick], starts[pick]
    bounds, stop = [], count
    while stop > 0:
        bounds.append((int(cut[stop]), stop))
        stop = int(cut[stop])
    return bounds[::-1]


def _graph_file(modality: str, heads_only: bool) -> str:
    if heads_only:
        return IMAGE_HEADS_ONNX_FILE if modality == "image" else TEXT_HEADS_ONNX_FILE
    return IMAGE_ONNX_FILE if modality == "image" else TEXT_ONNX_FILE


def pixel_dtype(onnx_type: str) -> type:
    """The numpy dtype of a backbone graph's 0..255 pixel input: uint8, else float32."""
    return np.uint8 if onnx_type == "tensor(uint8)" else np.float32


def item_generators(seed: Seeds, count: int) -> list[np.random.Generator]:
    """One Generator per item: from the item's own seed, or spawned from one int seed."""
    if isinstance(seed, int | np.integer):
        children = np.random.SeedSequence(int(seed)).spawn(count)
        return [np.random.default_rng(child) for child in children]
    seeds = list(seed)
    if len(seeds) != count:
        raise EncoderRuntimeError(f"{len(seeds)} seeds given for {count} items; give one each")
    return [np.random.default_rng(int(item_seed)) for item_seed in seeds]


def _repeated(array: np.ndarray | None, count: int) -> np.ndarray | None:
    """`count` copies of `array` along a new leading axis (the draws)."""
    return None if array is None else np.repeat(array[None], count, axis=0)


def _slice_batch(name: str, array: np.ndarray, start: int, stop: int) -> np.ndarray:
    """Rows start:stop of the batch axis (axis 1 for masks, axis 0 otherwise)."""
    if name.endswith("masks"):
        return np.ascontiguousarray(array[:, start:stop])
    return array[start:stop]
