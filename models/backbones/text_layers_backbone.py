"""all-MiniLM-L6-v2 read at every layer: the words a caption uses as well as what it means.

The plain backbone (models.backbones.text_backbone) keeps the last layer's token vectors,
averaged: what sentence-transformers trained to match paraphrases. Clip-art captions are
authors' titles and keywords, where sharing a rare word ("tux", "flag", "chess") says much of
whether two items belong together, and that lives in the lower layers, nearest the token
embeddings. This backbone returns the plain vector first, then the same masked mean of every
lower layer's token vectors (the embedding layer's output, then layers 1 to 5), each scaled to
unit length as the plain vector is, so that no layer swamps the heads' first layer and no
constant is fitted to a dataset.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from models.backbones.text_backbone import MiniLM

LOWER_LAYERS = (0, 1, 2, 3, 4, 5)  # hidden_states indices: 0 the embeddings, 6 the last layer


class MiniLMLayers(MiniLM):
    """Captions -> features (N, 384 * 7) float32: the plain unit vector, then one unit vector
    per lower layer."""

    name = "all-minilm-l6-v2-layers"
    readout = "-" + "".join(str(layer) for layer in LOWER_LAYERS)
    dim = MiniLM.dim * (1 + len(LOWER_LAYERS))

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        output = self.network(input_ids=ids, attention_mask=mask, output_hidden_states=True)
        states = output.hidden_states
        layers = [states[-1], *(states[i] for i in LOWER_LAYERS)]
        weights = mask.unsqueeze(-1).to(states[-1].dtype)
        count = weights.sum(dim=1).clamp(min=1e-9)
        return torch.cat([F.normalize((h * weights).sum(dim=1) / count, dim=-1) for h in layers], 1)
