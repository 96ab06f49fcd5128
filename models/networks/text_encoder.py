"""Word-embedding + GRU caption encoder (VSE++ style) with MC-dropout masks on the word
embeddings and before the Gaussian heads."""

from __future__ import annotations

import torch
from torch import nn

from models.networks.heads import GaussianHeads, init_linear
from models.networks.model_config import ModelConfig
from models.networks.tokenizer import PAD_ID


class TextEncoder(nn.Module):
    """ids (N, T), lengths (N,), word masks (S, N, T, E), head masks (S, N, H)
    -> mu, logvar (S * N, D), draw-major.

    The caption embedding is the GRU state at its last real token (VSE++). The GRU is
    unidirectional, so the padding after a caption does not change that state; this keeps the
    graph free of packed sequences and lets ONNX Runtime run one GRU over the whole batch.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embedding = nn.Embedding(config.vocab_size, config.word_dim, padding_idx=PAD_ID)
        self.gru = nn.GRU(config.word_dim, config.text_hidden, batch_first=True)
        self.heads = GaussianHeads(config.text_hidden, config, gaussian=config.gaussian_captions)
        self.word_dim = config.word_dim
        self.feature_dim = config.text_hidden
        nn.init.uniform_(self.embedding.weight, -0.1, 0.1)
        init_linear(self)

    def forward(
        self,
        ids: torch.Tensor,
        lengths: torch.Tensor,
        word_masks: torch.Tensor,
        head_masks: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        num_draws, batch, steps, width = word_masks.shape
        words = self.embedding(ids).unsqueeze(0) * word_masks  # (S, N, T, E)
        states, _ = self.gru(words.reshape(num_draws * batch, steps, width))  # (S*N, T, H)
        last = (lengths - 1).repeat(num_draws)  # (S * N,)
        index = last.view(-1, 1, 1).expand(-1, 1, states.shape[-1])  # (S * N, 1, H)
        features = states.gather(1, index).squeeze(1)  # (S * N, H)
        masked = features * head_masks.reshape(num_draws * batch, -1)  # (S * N, H)
        return self.heads(masked)  # (S * N, D) each
