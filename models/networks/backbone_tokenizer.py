"""The tokenizer of a pretrained text backbone (a `tokenizers` tokenizer.json), set up the one
way every caller uses it: batches padded to their longest caption, captions cut at a maximum
number of tokens."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np


def load_tokenizer(path: Path | str, max_tokens: int):
    """A tokenizers.Tokenizer read from `path` that pads a batch to its longest caption and cuts
    captions at `max_tokens` (a tokenizer.json may pad every caption to a fixed length, as
    all-MiniLM-L6-v2's does to 128, which only costs time)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.enable_truncation(max_tokens)
    padding = tokenizer.padding or {}
    tokenizer.enable_padding(  # id 0, "[PAD]": BERT's and the tokenizers library's default
        pad_id=padding.get("pad_id", 0), pad_token=padding.get("pad_token", "[PAD]")
    )
    return tokenizer


def caption_tokens(tokenizer, captions: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """input_ids and attention_mask, int64 (N, T), of a batch of captions."""
    encoded = tokenizer.encode_batch(list(captions))
    ids = np.array([e.ids for e in encoded], dtype=np.int64).reshape(len(encoded), -1)
    mask = np.array([e.attention_mask for e in encoded], dtype=np.int64).reshape(ids.shape)
    return ids, mask
