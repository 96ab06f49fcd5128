"""PVSE: the losses against direct loop formulas, the network's shapes and masking, and a
short training run through the CLI."""

import itertools
import json
import math

import pytest
import torch
from typer.testing import CliRunner

from models.datasets.shapes import generate_shapes
from models.networks.model_config import ConfigError, ModelConfig
from models.objectives.hinge import hinge_triplet_loss
from models.pvse.losses import diversity_loss, mmd_rbf, pvse_loss
from models.pvse.max_pair import max_pair_similarity
from models.pvse.model import PvseModel
from models.pvse.network import PvseOutput, summarize
from probsearch.cli import app

torch.set_num_threads(1)
CONFIG = ModelConfig(model_type="pvse", embed_dim=8, num_embeds=3, vocab_size=20)


def unit(*shape: int, seed: int) -> torch.Tensor:
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return torch.nn.functional.normalize(x, dim=-1)


def test_max_pair_similarity_is_the_best_of_the_k_by_k_cosines() -> None:
    a, b = unit(4, 3, 5, seed=0), unit(6, 2, 5, seed=1)
    got = max_pair_similarity(a, b)
    for i, j in itertools.product(range(4), range(6)):
        best = max(float(a[i, p] @ b[j, q]) for p in range(3) for q in range(2))
        assert got[i, j].item() == pytest.approx(best, abs=1e-12)


def test_diversity_loss_matches_the_gram_formula() -> None:
    maps = torch.rand(5, 3, 7, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    expected = 0.0
    for item in maps:
        k = len(item)
        rows = [r / math.sqrt(float(r @ r)) for r in item]
        off = [float(rows[p] @ rows[q]) - (p == q) for p in range(k) for q in range(k)]
        expected += math.sqrt(sum(v * v for v in off)) / k**2
    assert diversity_loss(maps).item() == pytest.approx(expected / len(maps), rel=1e-12)


def test_diversity_loss_is_zero_for_orthogonal_maps_and_largest_for_identical_ones() -> None:
    orthogonal = torch.eye(3, dtype=torch.float64)[None].repeat(2, 1, 1)  # (2, K=3, R=3)
    assert diversity_loss(orthogonal).item() == pytest.approx(0.0, abs=1e-12)
    same = torch.ones(2, 3, 4, dtype=torch.float64)
    # G is all ones: ||G - I||_F = sqrt(K^2 - K)
    assert diversity_loss(same).item() == pytest.approx(math.sqrt(6) / 9, rel=1e-12)


def test_mmd_matches_the_double_sum_and_vanishes_for_equal_samples() -> None:
    x, y = unit(6, 4, seed=3), unit(5, 4, seed=4)
    gamma = 0.7

    def k(a: torch.Tensor, b: torch.Tensor) -> float:
        return math.exp(-gamma * float((a - b) @ (a - b)))

    xx = sum(k(a, b) for a in x for b in x) / 36
    yy = sum(k(a, b) for a in y for b in y) / 25
    xy = sum(k(a, b) for a in x for b in y) / 30
    assert mmd_rbf(x, y, gamma).item() == pytest.approx(xx + yy - 2 * xy, rel=1e-10)
    assert mmd_rbf(x, x, gamma).item() == pytest.approx(0.0, abs=1e-12)
    assert mmd_rbf(x, y, gamma).item() > 0


def test_pvse_loss_adds_the_weighted_terms_to_the_mil_hinge() -> None:
    def output(n: int, seed: int) -> PvseOutput:
        emb = unit(n, 2, 4, seed=seed)
        attention = torch.rand(n, 2, 5, generator=torch.Generator().manual_seed(seed + 9))
        return PvseOutput(*summarize(emb, 1e-6), emb, attention.double(), emb)

    image, caption = output(3, 5), output(6, 6)
    owner = torch.tensor([0, 0, 1, 1, 2, 2])
    mil = hinge_triplet_loss(
        max_pair_similarity(image.embeddings, caption.embeddings), owner, 0.2, "sum"
    )
    div = diversity_loss(image.attention) + diversity_loss(caption.attention)
    mmd = mmd_rbf(image.embeddings.reshape(-1, 4), caption.embeddings.reshape(-1, 4))
    got = pvse_loss(image, caption, owner, None, 0.2, "sum", 0.3, 0.05)
    assert got.item() == pytest.approx((mil + 0.3 * div + 0.05 * mmd).item(), rel=1e-12)
    assert pvse_loss(image, caption, owner, None, 0.2, "sum", 0, 0).item() == pytest.approx(
        mil.item(), rel=1e-12
    )


def test_summary_is_the_mean_and_the_spread_of_the_k_embeddings() -> None:
    emb = unit(4, 3, 8, seed=7)
    mu, logvar = summarize(emb, 1e-6)
    torch.testing.assert_close(mu, emb.mean(dim=1))
    for n in range(4):
        spread = sum(float((e - mu[n]) @ (e - mu[n])) for e in emb[n]) / 3
        assert torch.allclose(logvar[n], torch.full((8,), math.log(spread / 8), dtype=emb.dtype))
    collapsed = emb[:, :1].repeat(1, 3, 1)
    assert summarize(collapsed, 1e-6)[1].max().item() == pytest.approx(math.log(1e-6))


def test_network_gives_k_unit_embeddings_and_ignores_caption_padding() -> None:
    torch.manual_seed(0)
    model = PvseModel(CONFIG).eval()
    out = model.embed_images(torch.randn(2, 3, 64, 64))
    assert out.embeddings.shape == (2, 3, 8) and out.attention.shape == (2, 3, 16)
    torch.testing.assert_close(out.embeddings.norm(dim=-1), torch.ones(2, 3))
    ids = torch.tensor([[3, 4, 5, 0, 0], [3, 4, 5, 6, 7]])
    lengths = torch.tensor([3, 5])
    text = model.embed_texts(ids, lengths)
    short = model.embed_texts(ids[:1, :3], lengths[:1])
    torch.testing.assert_close(text.embeddings[:1], short.embeddings)
    assert text.attention[0, :, 3:].abs().max().item() < 1e-6
    mu, _ = model.encode_texts(ids, lengths)
    torch.testing.assert_close(mu, text.mu)


def test_config_refuses_zero_embeddings_and_other_metrics() -> None:
    with pytest.raises(ConfigError, match="num_embeds"):
        ModelConfig(model_type="pvse", num_embeds=0)
    with pytest.raises(ConfigError, match="max_pair"):
        ModelConfig(model_type="pvse", metric="w2")


@pytest.fixture(scope="module")
def small_shapes(tmp_path_factory):
    return generate_shapes(
        tmp_path_factory.mktemp("small") / "shapes", 40, seed=1, progress=False, workers=1
    )


def test_cli_trains_a_pvse_model_with_k_embeddings(small_shapes, tmp_path) -> None:
    out = tmp_path / "pvse"
    args = ["train", "--data", str(small_shapes), "--out", str(out), "--model-type", "pvse",
            "--num-embeds", "2", "--epochs", "1", "--batch-size", "16", "--embed-dim", "8",
            "--no-progress"]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    saved = json.loads((out / "model.json").read_text())
    assert saved["model_type"] == "pvse" and saved["num_embeds"] == 2
    assert saved["onnx_io"]["image_encoder.onnx"]["outputs"]["embeddings"][1][1:] == [2, 8]
    assert (out / "image_encoder.onnx").is_file() and (out / "text_encoder.onnx").is_file()
    check_onnx_embeddings_match_torch(out)


def check_onnx_embeddings_match_torch(model_dir) -> None:
    """ONNX Runtime gives all K embeddings, deterministic and MC draws, as torch does."""
    import numpy as np
    from PIL import Image

    from models.networks.probabilistic_model import load_model
    from models.onnx.encoder_runtime import OnnxEncoder

    model = load_model(model_dir)
    texts = OnnxEncoder(model_dir, "text").encode_texts(["a red circle", "blue"], mc_samples=3)
    assert texts.embeddings.shape == (2, 2, 8) and texts.mc_embeddings.shape == (3, 2, 2, 8)
    ids, lengths = OnnxEncoder(model_dir, "text").tokenizer.encode_batch(["a red circle"], 32)
    with torch.no_grad():
        want = model.embed_texts(torch.from_numpy(ids), torch.from_numpy(lengths)).embeddings
    np.testing.assert_allclose(texts.embeddings[:1], want.numpy(), atol=1e-4)
    assert np.abs(texts.mc_embeddings - texts.embeddings[None]).max() > 1e-3  # draws differ
    images = [Image.new("RGB", (64, 64), (200, 30, 30))]
    encoded = OnnxEncoder(model_dir, "image").encode_images(images)
    assert encoded.embeddings.shape == (1, 2, 8) and encoded.mc_embeddings is None
    np.testing.assert_allclose(np.linalg.norm(encoded.embeddings, axis=-1), 1.0, atol=1e-5)
