"""OnnxEncoder on a trained model dir: same embeddings as torch, seeded MC draws, chunking,
provider choice and errors."""

import dataclasses
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from models.datasets.records import load_dataset
from models.networks.model_config import ModelConfig
from models.networks.preprocess import images_to_array, load_image
from models.networks.probabilistic_model import load_model
from models.networks.tokenizer import Tokenizer
from models.onnx.encoder_runtime import EncoderRuntimeError, OnnxEncoder, choose_providers
from models.onnx.export import export_model_dir

TEXTS = [
    "a red circle",
    "a small blue square left of a green star",
    "something colourful",
    "an unseenword triangle",
    "",
]


@pytest.fixture(scope="module")
def text_encoder(tiny_model_dir) -> OnnxEncoder:
    return OnnxEncoder(tiny_model_dir, "text")


@pytest.fixture(scope="module")
def image_encoder(tiny_model_dir) -> OnnxEncoder:
    return OnnxEncoder(tiny_model_dir, "image")


@pytest.fixture(scope="module")
def images(shapes_dir) -> list[Image.Image]:
    records = load_dataset(shapes_dir, split="val").images[:6]
    return [load_image(r.path) for r in records]


def test_cpu_provider_is_used_and_reported(text_encoder) -> None:
    assert text_encoder.provider == "CPUExecutionProvider"  # this machine has no GPU
    assert choose_providers("cpu") == ["CPUExecutionProvider"]
    assert text_encoder.embed_dim == text_encoder.config.embed_dim


def test_text_embeddings_match_torch(tiny_model_dir, text_encoder) -> None:
    out = text_encoder.encode_texts(TEXTS)
    model = load_model(tiny_model_dir)
    ids, lengths = Tokenizer.load(tiny_model_dir / "vocab.json").encode_batch(TEXTS, 32)
    with torch.no_grad():
        mu, logvar = model.encode_texts(torch.from_numpy(ids), torch.from_numpy(lengths))
    np.testing.assert_allclose(out.mu, mu.numpy(), atol=1e-4)
    np.testing.assert_allclose(out.logvar, logvar.numpy(), atol=1e-4)
    assert out.mc_mu is None and out.mc_logvar is None
    assert out.mu.dtype == np.float32 and out.mu.shape == (5, text_encoder.embed_dim)


def test_image_embeddings_match_torch(tiny_model_dir, image_encoder, images) -> None:
    out = image_encoder.encode_images(images)
    model = load_model(tiny_model_dir)
    pixels = torch.from_numpy(images_to_array(images, model.config))
    with torch.no_grad():
        mu, logvar = model.encode_images(pixels)
    np.testing.assert_allclose(out.mu, mu.numpy(), atol=1e-4)
    np.testing.assert_allclose(out.logvar, logvar.numpy(), atol=1e-4)


def test_mc_draws_are_seeded_and_vary(text_encoder) -> None:
    first = text_encoder.encode_texts(TEXTS, mc_samples=6, seed=3)
    again = text_encoder.encode_texts(TEXTS, mc_samples=6, seed=3)
    other = text_encoder.encode_texts(TEXTS, mc_samples=6, seed=4)
    plain = text_encoder.encode_texts(TEXTS)
    assert first.mc_mu.shape == first.mc_logvar.shape == (6, 5, text_encoder.embed_dim)
    np.testing.assert_array_equal(first.mc_mu, again.mc_mu)
    assert not np.allclose(first.mc_mu, other.mc_mu)
    np.testing.assert_allclose(first.mu, plain.mu, atol=1e-6)  # block 0 is deterministic
    spread = first.mc_mu.var(axis=0).sum(axis=1)  # feature uncertainty per caption
    assert np.all(spread > 0)
    assert not first.identical_draws and not text_encoder.deterministic


@pytest.fixture(scope="module")
def no_dropout_dir(tiny_model_dir, tmp_path_factory) -> Path:
    """The tiny model with dropout 0, re-exported."""
    out = tmp_path_factory.mktemp("no-dropout")
    shutil.copytree(tiny_model_dir, out, dirs_exist_ok=True)
    dataclasses.replace(ModelConfig.load(out), dropout=0.0).save(out)
    export_model_dir(out, verify=False)
    return out


def test_a_model_without_dropout_repeats_its_deterministic_embedding(
    no_dropout_dir, images
) -> None:
    """Its draws are the torch model's embedding, repeated, and say so."""
    model = load_model(no_dropout_dir)
    text, image = OnnxEncoder(no_dropout_dir, "text"), OnnxEncoder(no_dropout_dir, "image")
    ids, lengths = Tokenizer.load(no_dropout_dir / "vocab.json").encode_batch(TEXTS, 32)
    with torch.no_grad():
        want = {
            "text": model.encode_texts(torch.from_numpy(ids), torch.from_numpy(lengths)),
            "image": model.encode_images(torch.from_numpy(images_to_array(images, model.config))),
        }
    outs = {"text": text.encode_texts(TEXTS, 5, seed=1), "image": image.encode_images(images, 5)}
    for name, out in outs.items():
        assert text.deterministic and out.identical_draws, name
        assert out.mc_mu.shape == (5, *out.mu.shape) and out.mc_logvar.shape == out.mc_mu.shape
        for draws, expected in ((out.mc_mu, want[name][0]), (out.mc_logvar, want[name][1])):
            for draw in draws:
                np.testing.assert_allclose(draw, expected.numpy(), atol=1e-4, err_msg=name)


def test_image_mc_draws_and_chunking(tiny_model_dir, image_encoder, images) -> None:
    whole = image_encoder.encode_images(images, mc_samples=3, seed=1)
    chunked = OnnxEncoder(tiny_model_dir, "image", batch_size=4).encode_images(
        images, mc_samples=3, seed=1
    )
    np.testing.assert_allclose(whole.mc_mu, chunked.mc_mu, atol=1e-5)
    np.testing.assert_allclose(whole.mu, chunked.mu, atol=1e-5)
    assert not np.allclose(whole.mc_mu[0], whole.mu)


def test_text_chunking_does_not_change_results(tiny_model_dir, text_encoder) -> None:
    small = OnnxEncoder(tiny_model_dir, "text", batch_size=2)
    np.testing.assert_allclose(
        small.encode_texts(TEXTS, mc_samples=2, seed=5).mc_mu,
        text_encoder.encode_texts(TEXTS, mc_samples=2, seed=5).mc_mu,
        atol=1e-5,
    )


class MeetingSession:
    """An ONNX Runtime session whose first two runs wait for each other: both finish only
    when two chunks run at once (else the barrier breaks after its timeout)."""

    def __init__(self, session) -> None:
        self.session, self.calls = session, 0
        self.barrier = threading.Barrier(2, timeout=20)
        self.lock = threading.Lock()

    def run(self, outputs, feeds):
        with self.lock:
            self.calls += 1
            meet = self.calls <= 2
        if meet:
            self.barrier.wait()
        return self.session.run(outputs, feeds)


def test_workers_run_chunks_at_once_with_the_same_results(tiny_model_dir, images) -> None:
    one = OnnxEncoder(tiny_model_dir, "text", batch_size=2)
    two = OnnxEncoder(tiny_model_dir, "text", batch_size=2, workers=2)
    two.session = MeetingSession(two.session)
    alone, together = (e.encode_texts(TEXTS, mc_samples=3, seed=5) for e in (one, two))
    assert two.session.calls == 3
    np.testing.assert_array_equal(together.mu, alone.mu)
    np.testing.assert_array_equal(together.mc_logvar, alone.mc_logvar)
    pictures = OnnxEncoder(tiny_model_dir, "image", batch_size=4, workers=2)
    pictures.session = MeetingSession(pictures.session)
    np.testing.assert_array_equal(
        pictures.encode_images(images, mc_samples=2, seed=1).mc_mu,
        OnnxEncoder(tiny_model_dir, "image", batch_size=4).encode_images(images, 2, 1).mc_mu,
    )


def test_empty_batch(text_encoder, image_encoder) -> None:
    assert text_encoder.encode_texts([]).mu.shape == (0, text_encoder.embed_dim)
    assert image_encoder.encode_images([], mc_samples=2).mc_mu.shape == (
        2,
        0,
        image_encoder.embed_dim,
    )


def test_wrong_modality_device_and_mc_count_are_refused(
    tiny_model_dir, text_encoder, image_encoder
) -> None:
    with pytest.raises(EncoderRuntimeError, match="not an image encoder"):
        text_encoder.encode_images([Image.new("RGB", (8, 8))])
    with pytest.raises(EncoderRuntimeError, match="not a caption encoder"):
        image_encoder.encode_texts(["a"])
    with pytest.raises(EncoderRuntimeError, match="mc_samples"):
        text_encoder.encode_texts(["a"], mc_samples=-1)
    with pytest.raises(EncoderRuntimeError, match="CUDAExecutionProvider"):
        OnnxEncoder(tiny_model_dir, "text", device="cuda")
    with pytest.raises(EncoderRuntimeError, match="unknown device"):
        OnnxEncoder(tiny_model_dir, "text", device="tpu")
    with pytest.raises(EncoderRuntimeError, match="unknown modality"):
        OnnxEncoder(tiny_model_dir, "audio")  # type: ignore[arg-type]


@pytest.mark.filterwarnings("ignore:Specified provider 'CUDAExecutionProvider'")
def test_a_cuda_provider_that_does_not_start_is_never_silent(
    tiny_model_dir, monkeypatch, caplog
) -> None:
    """ORT lists CUDA (as onnxruntime-gpu of another CUDA major would) but runs the session on
    the CPU, as this machine's ORT does for a provider it lacks: auto warns, cuda refuses."""
    import onnxruntime

    cuda = "CUDAExecutionProvider"
    monkeypatch.setattr(
        onnxruntime, "get_available_providers", lambda: [cuda, "CPUExecutionProvider"]
    )
    with caplog.at_level("WARNING", logger="models.onnx.encoder_runtime"):
        encoder = OnnxEncoder(tiny_model_dir, "text", device="auto")
    assert encoder.provider == "CPUExecutionProvider"
    assert f"lists {cuda} but could not start it" in caplog.text
    with pytest.raises(EncoderRuntimeError, match="could not start it"):
        OnnxEncoder(tiny_model_dir, "text", device="cuda")


def test_per_item_seeds_make_draws_independent_of_the_batch(text_encoder, image_encoder, images):
    """With one seed per item, an item's MC draws are the same alone or in any batch."""
    texts = ["a red circle", "two small blue squares left of a big green triangle", "shapes"]
    batch = text_encoder.encode_texts(texts, mc_samples=4, seed=[11, 22, 33])
    for i, text in enumerate(texts):
        alone = text_encoder.encode_texts([text], mc_samples=4, seed=[[11, 22, 33][i]])
        np.testing.assert_allclose(batch.mc_mu[:, i], alone.mc_mu[:, 0], atol=1e-5)
        np.testing.assert_allclose(batch.mc_logvar[:, i], alone.mc_logvar[:, 0], atol=1e-5)
    reordered = image_encoder.encode_images(images[:3][::-1], mc_samples=3, seed=[3, 2, 1])
    forward = image_encoder.encode_images(images[:3], mc_samples=3, seed=[1, 2, 3])
    np.testing.assert_allclose(reordered.mc_mu[:, ::-1], forward.mc_mu, atol=1e-5)
    with pytest.raises(EncoderRuntimeError, match="one each"):
        text_encoder.encode_texts(texts, mc_samples=2, seed=[1, 2])


def test_onnx_runtime_pools_follow_the_budget(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pools follow the budget passed in; without one, the batch rule for this process's
    CPUs: PROBSEARCH_THREADS reaches an encoder through the command's settings, never from the
    environment inside the constructor."""
    from models.threads import ThreadBudget, thread_budget

    encoder = OnnxEncoder(tiny_model_dir, "text", device="cpu", threads=ThreadBudget(1))
    options = encoder.session.get_session_options()
    assert (options.intra_op_num_threads, options.inter_op_num_threads) == (1, 1)
    encoder = OnnxEncoder(tiny_model_dir, "text", device="cpu", threads=ThreadBudget(2))
    assert encoder.session.get_session_options().intra_op_num_threads == 2
    monkeypatch.setenv("PROBSEARCH_THREADS", "3")
    encoder = OnnxEncoder(tiny_model_dir, "text", device="cpu")
    expected = thread_budget("batch").intra_op
    assert encoder.session.get_session_options().intra_op_num_threads == expected
