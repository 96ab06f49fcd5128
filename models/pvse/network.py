"""PVSE encoders (Song & Soleymani): K embeddings per item from a polysemous instance
embedding network (PIE-Net) on top of the project's CNN and GRU trunks, and PIE-Net's K heads
on a pretrained backbone's pooled vector (PvseFeatureHeads)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from models.networks.feature_heads import FeatureHeads
from models.networks.heads import init_linear
from models.networks.image_encoder import ImageEncoder
from models.networks.model_config import ModelConfig
from models.networks.text_encoder import TextEncoder

MASKED_SCORE = -1e4  # attention logit of a padding position (finite: exports without NaN)


@dataclass
class PvseOutput:
    """One forward pass over M = S * N rows (draw-major).

    embeddings: (M, K, D) unit vectors; attention: (M, K, R) softmax over the R local features
    (PvseFeatureHeads: the K residuals, the rows the diversity loss decorrelates);
    residuals: (M, K, D) the locally-guided features (before the fusion with the global one).
    mu, logvar: (M, D) the Gaussian summary of the K embeddings (see `summarize`).
    """

    mu: torch.Tensor
    logvar: torch.Tensor
    embeddings: torch.Tensor
    attention: torch.Tensor
    residuals: torch.Tensor


def summarize(embeddings: torch.Tensor, var_min: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(M, K, D) -> mu (M, D), the mean of the K embeddings, and a spherical logvar (M, D):
    every dim holds ln(max(spread / D, var_min)), where spread = mean_k ||z_k - mu||^2 is the
    total variance of the K embeddings. log_det = D * that value then grows with the spread."""
    mu = embeddings.mean(dim=1)  # (M, D)
    spread = (embeddings - mu[:, None]).square().sum(dim=-1).mean(dim=1)  # (M,)
    per_dim = (spread / embeddings.shape[-1]).clamp(min=var_min)
    return mu, per_dim.log()[:, None].expand_as(mu)


class PieNet(nn.Module):
    """Local features (M, R, C) + global feature (M, D) -> K embeddings (paper eqs. 2-4).

    alpha = softmax_R(w2 tanh(w1 psi^T)), upsilon = sigmoid(alpha psi w3 + b3),
    z = LayerNorm(phi + upsilon), then L2-normalised (the paper scores pairs by cosine).
    """

    def __init__(self, local_dim: int, embed_dim: int, num_embeds: int) -> None:
        super().__init__()
        hidden = max(local_dim // 2, 1)  # A = D_local / 2 as in the paper
        self.w1 = nn.Linear(local_dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, num_embeds, bias=False)
        self.fc = nn.Linear(local_dim, embed_dim)
        self.norm = nn.LayerNorm(embed_dim)
        init_linear(self.fc)
        nn.init.xavier_uniform_(self.w1.weight)
        nn.init.xavier_uniform_(self.w2.weight)

    def forward(
        self, local: torch.Tensor, global_: torch.Tensor, valid: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        scores = self.w2(torch.tanh(self.w1(local))).transpose(1, 2)  # (M, K, R)
        if valid is not None:
            scores = scores.masked_fill(~valid[:, None, :], MASKED_SCORE)
        attention = scores.softmax(dim=-1)  # (M, K, R)
        residuals = torch.sigmoid(self.fc(attention @ local))  # (M, K, D)
        return fuse(global_, residuals, self.norm), attention, residuals


def fuse(global_: torch.Tensor, residuals: torch.Tensor, norm: nn.LayerNorm) -> torch.Tensor:
    """PIE-Net's fusion: z_k = LayerNorm(phi + upsilon_k), L2-normalised; global (M, D) and
    residuals (M, K, D) -> K unit embeddings (M, K, D)."""
    fused = norm(global_[:, None, :] + residuals)  # (M, K, D)
    return nn.functional.normalize(fused, dim=-1)


class PvseImageEncoder(ImageEncoder):
    """The CNN trunk of ImageEncoder; the 4x4 pooled grid gives R = 16 local features, the
    trunk feature through the mean head's linear layer the global one. Outputs (mu, logvar,
    embeddings) with the same dropout-mask input as the Gaussian image encoder."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.var_min = config.var_min
        self.pie = PieNet(config.cnn_channels[-1], config.embed_dim, config.num_embeds)

    def embed(self, images: torch.Tensor, masks: torch.Tensor) -> PvseOutput:
        num_draws = masks.shape[0]
        x = images.unsqueeze(0).expand(num_draws, *images.shape).flatten(0, 1)  # (S*N, 3, H, W)
        parts = masks.flatten(0, 1).split(self.mask_widths, dim=1)  # each (S*N, C_k)
        for block, mask in zip(self.blocks, parts[:-1], strict=True):
            x = block(x) * mask[:, :, None, None]
        grid = self.project[0](x)  # (S*N, C, 4, 4)
        features = self.project[1:](grid) * parts[-1]  # (S*N, F)
        local = grid.flatten(2).transpose(1, 2)  # (S*N, 16, C)
        embeddings, attention, residuals = self.pie(local, self.heads.mu_head(features))
        return PvseOutput(*summarize(embeddings, self.var_min), embeddings, attention, residuals)

    def forward(
        self, images: torch.Tensor, masks: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        out = self.embed(images, masks)
        return out.mu, out.logvar, out.embeddings


class PvseTextEncoder(TextEncoder):
    """The GRU caption encoder; its masked word embeddings are the R = T local features
    (padding excluded from the attention), the last GRU state through the mean head's linear
    layer the global one."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.var_min = config.var_min
        self.pie = PieNet(config.word_dim, config.embed_dim, config.num_embeds)

    def embed(
        self,
        ids: torch.Tensor,
        lengths: torch.Tensor,
        word_masks: torch.Tensor,
        head_masks: torch.Tensor,
    ) -> PvseOutput:
        num_draws, _, steps, width = word_masks.shape
        words = (self.embedding(ids).unsqueeze(0) * word_masks).reshape(-1, steps, width)
        states, _ = self.gru(words)  # (S*N, T, H)
        last = (lengths - 1).repeat(num_draws)  # (S * N,)
        index = last.view(-1, 1, 1).expand(-1, 1, states.shape[-1])  # (S * N, 1, H)
        features = states.gather(1, index).squeeze(1) * head_masks.reshape(-1, states.shape[-1])
        positions = torch.arange(steps, device=ids.device)[None, :]  # (1, T)
        valid = positions <= last[:, None]  # (S*N, T)
        embeddings, attention, residuals = self.pie(words, self.heads.mu_head(features), valid)
        return PvseOutput(*summarize(embeddings, self.var_min), embeddings, attention, residuals)

    def forward(
        self,
        ids: torch.Tensor,
        lengths: torch.Tensor,
        word_masks: torch.Tensor,
        head_masks: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        out = self.embed(ids, lengths, word_masks, head_masks)
        return out.mu, out.logvar, out.embeddings


class PvseFeatureHeads(FeatureHeads):
    """PVSE on a pretrained backbone's pooled vector: features (N, F) + dropout masks
    (S, N, F + H) -> (mu, logvar, embeddings (S * N, K, D)), the masks as FeatureHeads'.

    A pooled vector has no local features for PIE-Net to attend over, so K residual heads of
    the vector take the place of the K attention-weighted local features: upsilon_k =
    sigmoid(W_k x + b_k), one linear map of the (dropped-out) backbone vector x per head. The
    global feature phi is FeatureHeads' hidden MLP through the mean head's linear layer, and
    the two are fused as PIE-Net fuses them (`fuse`); mu and logvar `summarize` the K unit
    embeddings. The diversity loss decorrelates the K residuals (PvseOutput.attention), as it
    decorrelates PIE-Net's attention maps.
    """

    def __init__(
        self,
        in_features: int,
        config: ModelConfig,
        gaussian: bool = False,
        novelty_rows: int = 0,
        novelty_features: int = 0,
    ) -> None:
        super().__init__(in_features, config, False, novelty_rows, novelty_features)
        self.var_min = config.var_min
        self.num_embeds, self.embed_dim = config.num_embeds, config.embed_dim
        self.residual = nn.Linear(in_features, config.num_embeds * config.embed_dim)
        self.norm = nn.LayerNorm(config.embed_dim)
        init_linear(self.residual)

    def embed(self, features: torch.Tensor, masks: torch.Tensor) -> PvseOutput:
        x, hidden_mask = self.masked_inputs(features, masks)  # (S*N, F), (S*N, H)
        global_ = self.heads.mu_head(self.hidden(x) * hidden_mask)  # (S*N, D)
        raw = self.residual(x).reshape(-1, self.num_embeds, self.embed_dim)  # (S*N, K, D)
        residuals = torch.sigmoid(raw)
        embeddings = fuse(global_, residuals, self.norm)
        return PvseOutput(*summarize(embeddings, self.var_min), embeddings, residuals, residuals)

    def forward(  # type: ignore[override]
        self, features: torch.Tensor, masks: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        out = self.embed(features, masks)
        return out.mu, out.logvar, out.embeddings
