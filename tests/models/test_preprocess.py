"""Image decoding limits and errors, resize/normalise, and the caption tokenizer."""

import io

import numpy as np
import pytest
from PIL import Image

from models.networks.model_config import ModelConfig
from models.networks.preprocess import (
    ImageTooLargeError,
    InvalidImageError,
    decode_image,
    images_to_array,
    load_image,
)
from models.networks.tokenizer import PAD_ID, UNK_ID, Tokenizer, split_words


def png_bytes(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def test_decode_image_returns_rgb_for_grey_and_rgba_inputs() -> None:
    for mode in ("L", "RGBA", "P", "RGB"):
        decoded = decode_image(png_bytes(Image.new(mode, (7, 5))))
        assert decoded.mode == "RGB"
        assert decoded.size == (7, 5)


@pytest.mark.parametrize("data", [b"", b"hello, not an image", b"\x89PNG\r\n\x1a\n garbage"])
def test_decode_image_rejects_non_images(data: bytes) -> None:
    with pytest.raises(InvalidImageError):
        decode_image(data)


def test_decode_image_rejects_truncated_png() -> None:
    noise = np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)
    data = png_bytes(Image.fromarray(noise))
    with pytest.raises(InvalidImageError) as info:
        decode_image(data[: len(data) // 2])
    assert not isinstance(info.value, ImageTooLargeError)


def test_decode_image_enforces_the_pixel_limit() -> None:
    data = png_bytes(Image.new("RGB", (100, 60)))
    assert decode_image(data, max_pixels=6000).size == (100, 60)
    with pytest.raises(ImageTooLargeError, match="limit is 5999"):
        decode_image(data, max_pixels=5999)


def test_decompression_bomb_is_refused_before_decoding() -> None:
    # 9000 x 9000 one-bit pixels compress to a few kB but would decode to 81 M pixels.
    bomb = png_bytes(Image.new("1", (9000, 9000)))
    assert len(bomb) < 100_000
    with pytest.raises(ImageTooLargeError):
        decode_image(bomb)


def test_load_image_names_the_file(tmp_path) -> None:
    path = tmp_path / "broken.png"
    path.write_bytes(b"not a png")
    with pytest.raises(InvalidImageError, match=r"broken\.png"):
        load_image(path)
    with pytest.raises(InvalidImageError, match=r"missing\.png"):
        load_image(tmp_path / "missing.png")


def test_images_to_array_resizes_and_standardises() -> None:
    config = ModelConfig(image_size=16, image_mean=(0.5, 0.25, 0.0), image_std=(0.5, 0.25, 1.0))
    red = Image.new("RGB", (40, 30), (255, 0, 51))
    array = images_to_array([red, red.resize((16, 16))], config)
    assert array.shape == (2, 3, 16, 16) and array.dtype == np.float32
    expected = [(1.0 - 0.5) / 0.5, (0.0 - 0.25) / 0.25, 0.2]  # 51 / 255 = 0.2
    for channel, value in enumerate(expected):
        np.testing.assert_allclose(array[:, channel], value, atol=1e-6)
    assert images_to_array([], config).shape == (0, 3, 16, 16)


def test_split_words_lowercases_and_drops_punctuation() -> None:
    assert split_words("A Red star, left-of 2 CIRCLES!") == [
        "a",
        "red",
        "star",
        "left",
        "of",
        "2",
        "circles",
    ]


def test_tokenizer_vocabulary_order_and_encoding() -> None:
    tokenizer = Tokenizer.build(["a red star", "a blue star", "a star"])
    assert tokenizer.tokens[:2] == ["<pad>", "<unk>"]
    assert tokenizer.tokens[2:4] == ["a", "star"]  # most frequent first, ties alphabetical
    assert tokenizer.tokens[4:] == ["blue", "red"]
    ids, lengths = tokenizer.encode_batch(["A green star", "", "red"], max_len=8)
    a, star, red = (tokenizer.tokens.index(w) for w in ("a", "star", "red"))
    assert ids.dtype == np.int64 and lengths.dtype == np.int64
    assert ids.tolist() == [[a, UNK_ID, star], [UNK_ID, PAD_ID, PAD_ID], [red, PAD_ID, PAD_ID]]
    assert lengths.tolist() == [3, 1, 1]


def test_tokenizer_truncates_to_max_len() -> None:
    tokenizer = Tokenizer.build(["one two three four"])
    ids, lengths = tokenizer.encode_batch(["one two three four", "two"], max_len=2)
    assert ids.shape == (2, 2)
    assert lengths.tolist() == [2, 1]


def test_tokenizer_round_trips_through_json(tmp_path) -> None:
    tokenizer = Tokenizer.build(["a small blue square above a circle"])
    tokenizer.save(tmp_path / "vocab.json")
    loaded = Tokenizer.load(tmp_path / "vocab.json")
    assert loaded.tokens == tokenizer.tokens
    (tmp_path / "bad.json").write_text('{"tokens": ["a", "b"]}')
    with pytest.raises(ValueError, match="<pad>"):
        Tokenizer.load(tmp_path / "bad.json")
    with pytest.raises(ValueError, match="not found"):
        Tokenizer.load(tmp_path / "absent.json")
