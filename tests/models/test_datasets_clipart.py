"""The clip-art dataset: caption rules, the renderer's limits, and the written dataset."""

from __future__ import annotations

import json
import os
import stat
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from models.datasets import clipart_render
from models.datasets.cli import app
from models.datasets.clipart import LIBRARY, split_of, write_clipart
from models.datasets.clipart_metadata import (
    MetadataError,
    clean_description,
    clean_keywords,
    clean_title,
    keyword_caption,
    keywords_named,
    plural_folding,
    read_author_text,
)
from models.datasets.clipart_render import RenderError, RenderLimits, render_png
from models.datasets.records import load_dataset, plausible_match_matrix

NONE_SHARED: Counter[str] = Counter()


def svg(
    title: str = "", description: str = "", keywords=(), body: str = "", extra: str = ""
) -> str:
    items = "".join(f"<rdf:li>{k}</rdf:li>" for k in keywords)
    drawing = body or '<circle cx="50" cy="50" r="30" fill="#c00"/>'
    return f"""<?xml version="1.0"?>
<svg xmlns="http://www.w3.org/2000/svg" width="100" height="60" {extra}
     xmlns:dc="http://purl.org/dc/elements/1.1/" xmlns:cc="http://web.resource.org/cc/"
     xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#">
  <metadata><rdf:RDF><cc:Work rdf:about="">
    <dc:title>{title}</dc:title><dc:description>{description}</dc:description>
    <dc:subject><rdf:Bag>{items}</rdf:Bag></dc:subject>
  </cc:Work></rdf:RDF></metadata>
  {drawing}
</svg>"""


# ---- caption rules ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("title", "kept"),
    [
        ("An Apple", "An Apple"),
        ("cake1", "cake"),  # a digit glued to a word of 4+ letters
        ("MP3 player", "MP3 player"),
        ("libyan_arab_jamahiriya", "libyan arab jamahiriya"),
        ("HASH(0x862bbb8)", ""),
        ("Clipart by Nicu Buculei - jigsaw_red_10", ""),
        ("Part of the Flat Icon Collection (Wed Aug 25 23:29:46 2004)", ""),
        ("apple_01.svg", ""),
        ("", ""),
        ("42", ""),
        ("ralf@ark.in-berlin.de", ""),  # an author's address, not a title
        ("Telefono (email: frollandin@email.it)", "Telefono"),
    ],
)
def test_title_rules(title: str, kept: str) -> None:
    assert clean_title(title, NONE_SHARED) == kept


def test_a_title_many_drawings_share_names_their_collection() -> None:
    shared = Counter({"gramastar": 1375, "Bored dog": 1, "card": 10})
    assert clean_title("gramastar", shared) == ""
    assert clean_title("card", shared) == ""
    assert clean_title("Bored dog", shared) == "Bored dog"


def test_description_rules() -> None:
    assert clean_description("EPS converted from  http://aiga.org", "", NONE_SHARED) == (
        "EPS converted from"
    )
    assert clean_description("HASH(0x862bbb8)", "ireland", NONE_SHARED) == ""
    assert clean_description("Boating Rules", "boating rules", NONE_SHARED) == ""
    assert clean_description("a news paper", "Newspaper", NONE_SHARED) == "a news paper"
    assert clean_description("x" * 3, "", Counter({"xxx": 12})) == ""
    assert len(clean_description(" ".join(["word"] * 100), "", NONE_SHARED).split()) == 40


@pytest.mark.parametrize(
    ("description", "kept"),
    [
        ("contact: hermann.schwarting@knackich.de", ""),
        ("A pizza slice. Created by ringe. Email: ri@rin.no.", "A pizza slice. Created by ringe."),
        ("Um carro esporte, voyeg3r@gmail.com", "Um carro esporte"),
        (
            "Data from: NASA Johnson Space Center: http://eol.jsc.nasa.gov",
            ("Data from: NASA Johnson Space Center"),
        ),
        ("Ladies...  and gentlemen: a (bow) tie!", "Ladies... and gentlemen: a (bow) tie!"),
    ],
)
def test_descriptions_lose_addresses_and_what_they_leave(description: str, kept: str) -> None:
    assert clean_description(description, "", NONE_SHARED) == kept


def test_keyword_rules_drop_tool_tags_numbers_and_repeats_and_fold_plurals() -> None:
    plurals = plural_folding(["star", "stars", "shapes", "glass", "Flags", "flag"])
    assert plurals == {"stars": "star", "flags": "flag"}
    raw = ["hash", "", "Stars", "star", "magick", "0x8b754fc", "11", "United_Nations_Member"]
    assert clean_keywords(raw, plurals) == ("star", "united nations member")


def test_keyword_caption_and_its_fallback() -> None:
    assert keyword_caption(("food", "apple", "fruit"), "food/fruit") == (
        "a drawing of food, apple, fruit"
    )
    assert keyword_caption((), "people/stick_men") == "a drawing of stick men"
    assert keyword_caption(tuple("abcdefg"), "x") == "a drawing of a, b, c, d, e"


def test_keywords_named_are_whole_words_and_phrases() -> None:
    keywords = ("apple", "fruit", "united nations member", "pie")
    assert keywords_named("Two apples and a pineapple", keywords) == ("apple",)
    assert keywords_named("a United Nations member flag", keywords) == ("united nations member",)


def test_author_text_is_read_from_the_work() -> None:
    text = read_author_text(svg("An Apple", "red", ["hash", "apple"]).encode())
    assert (text.title, text.description, text.keywords) == ("An Apple", "red", ("hash", "apple"))


BILLION_LAUGHS = (
    b"""<?xml version="1.0"?>
<!DOCTYPE svg [<!ENTITY a "aaaaaaaaaa">"""
    + b"".join(
        f'<!ENTITY {chr(98 + i)} "{("&" + chr(97 + i) + ";") * 10}">'.encode() for i in range(9)
    )
    + b"""]><svg xmlns="http://www.w3.org/2000/svg"><title>&j;</title></svg>"""
)


@pytest.mark.parametrize("data", [b"<svg><metadata>", BILLION_LAUGHS], ids=["truncated", "bomb"])
def test_unreadable_xml_raises_metadata_error(data: bytes) -> None:
    with pytest.raises(MetadataError):
        read_author_text(data)


# ---- the renderer -------------------------------------------------------------------------


def test_render_lays_the_drawing_on_a_white_square(tmp_path: Path) -> None:
    source = tmp_path / "a.svg"
    source.write_text(svg("An Apple"))
    render_png(source, tmp_path / "a.png", 64, RenderLimits())
    with Image.open(tmp_path / "a.png") as image:
        pixels = np.asarray(image)
    assert image.mode == "RGB" and pixels.shape == (64, 64, 3)
    assert (pixels[0, 0] == 255).all() and (pixels[-1, -1] == 255).all()
    red = (pixels[..., 0] > 150) & (pixels[..., 1] < 80)
    assert red.sum() > 100
    assert not list(tmp_path.glob(".*tmp"))


def test_render_refuses_a_blank_drawing(tmp_path: Path) -> None:
    source = tmp_path / "blank.svg"
    source.write_text(svg("Nothing", body='<rect width="100" height="60" fill="white"/>'))
    with pytest.raises(RenderError) as caught:
        render_png(source, tmp_path / "blank.png", 64, RenderLimits())
    assert caught.value.reason == "blank" and not (tmp_path / "blank.png").exists()


def with_fake_renderer(tmp_path: Path, monkeypatch, script: str) -> Path:
    """An SVG to render, with the renderer replaced by a shell script (its lines after
    #!/bin/sh)."""
    renderer = tmp_path / "fake-renderer"
    renderer.write_text(f"#!/bin/sh\n{script}\n")
    renderer.chmod(renderer.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setattr(clipart_render, "RENDERER", str(renderer))
    source = tmp_path / "a.svg"
    source.write_text(svg("An Apple"))
    return source


def test_a_renderer_that_hangs_is_killed_at_the_timeout(tmp_path: Path, monkeypatch) -> None:
    source = with_fake_renderer(tmp_path, monkeypatch, "sleep 30")
    with pytest.raises(RenderError) as caught:
        render_png(source, tmp_path / "a.png", 64, RenderLimits(timeout_s=0.5))
    assert caught.value.reason == "timed out"


@pytest.mark.parametrize("prlimit", [True, False], ids=["prlimit", "preexec_fn"])
def test_the_renderer_runs_under_the_memory_and_cpu_limits(
    tmp_path: Path, monkeypatch, prlimit: bool
) -> None:
    """The renderer's own limits, as the shell reports them: through util-linux's prlimit and
    through the preexec_fn used where prlimit is missing."""
    if prlimit and clipart_render.PRLIMIT is None:
        pytest.fail("util-linux's prlimit is not installed (Debian installs it everywhere)")
    if not prlimit:
        monkeypatch.setattr(clipart_render, "PRLIMIT", None)
    report = 'echo "limits $(ulimit -v) $(ulimit -t)" >&2\nexit 1'
    source = with_fake_renderer(tmp_path, monkeypatch, report)
    limits = RenderLimits(timeout_s=4.0, memory_bytes=512 * 1024 * 1024)
    with pytest.raises(RenderError) as caught:
        render_png(source, tmp_path / "a.png", 64, limits)
    assert str(caught.value) == "renderer failed: limits 524288 5"  # KiB of memory, CPU seconds


def test_a_render_a_pixel_too_large_is_scaled_to_fit(tmp_path: Path, monkeypatch) -> None:
    """rsvg-convert rounds some sides up (225 px for --width 224); such a render is kept."""
    picture = tmp_path / "rounded.png"
    Image.new("RGB", (225, 113), (200, 0, 0)).save(picture)
    source = with_fake_renderer(tmp_path, monkeypatch, f"cat {picture}")
    render_png(source, tmp_path / "a.png", 224, RenderLimits())
    with Image.open(tmp_path / "a.png") as image:
        pixels = np.asarray(image)
    assert pixels.shape == (224, 224, 3)
    assert (pixels[112, :, 0] > 150).all() and (pixels[0, 0] == 255).all()


# ---- the dataset --------------------------------------------------------------------------


def make_library(root: Path) -> Path:
    """Five usable drawings in two categories, and one of each kind of bad file."""
    fruit, signs = root / "food" / "fruit", root / "signs"
    fruit.mkdir(parents=True)
    signs.mkdir()
    (fruit / "apple.svg").write_text(svg("An Apple", "", ["hash", "food", "apple", "fruit"]))
    (fruit / "apple_green.svg").write_text(
        svg("Green apple", "a green apple", ["apple", "fruit"], '<rect width="40" height="40"/>')
    )
    (fruit / "pear.svg").write_text(svg("HASH(0x1)", "", ["pear", "fruit"], "<ellipse rx='9'/>"))
    (fruit / "copy_of_apple.svg").write_text(
        svg("An Apple", "", ["hash", "food", "apple", "fruit"])
    )
    (signs / "stop.svg").write_text(
        svg("Stop sign", "", ["sign", "apple"], '<path d="M0 0h90v50z"/>')
    )
    (signs / "yield.svg").write_text(svg("", "", [], '<path d="M0 0h20v20z"/>'))
    (signs / "truncated.svg").write_text(svg("Cut")[:200])
    (signs / "scripted.svg").write_text(svg("Click", extra='onload="alert(1)"'))
    (signs / "huge.svg").write_text(svg("Huge", body="<!--" + "x" * 70_000 + "-->"))
    (signs / "blank.svg").write_text(svg("Blank", body='<rect width="1" height="1" fill="#fff"/>'))
    return root


LIMITS = RenderLimits(max_bytes=64_000)


def build(tmp_path: Path, size: int) -> tuple[Path, dict]:
    """The dataset of make_library's drawings at `size` pixels: its directory and meta."""
    out = tmp_path / "out"
    library = tmp_path / "svg"
    if not library.exists():
        make_library(library)
    meta = write_clipart(out, library=library, size=size, workers=1, limits=LIMITS, progress=False)
    return out, meta


def test_write_clipart_keeps_the_usable_drawings_and_counts_the_rest(tmp_path: Path) -> None:
    out, meta = build(tmp_path, 48)
    assert meta["num_images"] == 5
    assert meta["skipped"] == {
        "duplicate file": 1,
        "unreadable": 1,
        "scripted": 1,
        "too large": 1,
        "blank": 1,
    }
    skipped = [json.loads(line) for line in (out / "skipped.jsonl").read_text().splitlines()]
    assert sorted(s["reason"] for s in skipped) == sorted(
        ["duplicate file", "unreadable", "scripted", "too large", "blank"]
    )
    dataset = load_dataset(out)
    captions = {
        _source(out, im.id): [c.text for c in dataset.captions_of(im.id)] for im in dataset.images
    }
    assert captions == {
        "food/fruit/apple.svg": ["An Apple", "a drawing of food, apple, fruit"],
        "food/fruit/apple_green.svg": ["Green apple", "a green apple", "a drawing of apple, fruit"],
        "food/fruit/pear.svg": ["a drawing of pear, fruit"],  # the hash title is dropped
        "signs/stop.svg": ["Stop sign", "a drawing of sign, apple"],
        "signs/yield.svg": ["a drawing of signs"],  # no title, no keywords: its folder
    }
    for image in dataset.images:
        assert image.split == split_of(_source(out, image.id))
        with Image.open(image.path) as png:
            assert png.size == (48, 48) and png.mode == "RGB"


def _source(out: Path, image_id: str) -> str:
    for line in (out / "images.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record["id"] == image_id:
            return record["source"]
    raise KeyError(image_id)


def test_captions_match_the_drawings_whose_labels_hold_what_they_name(tmp_path: Path) -> None:
    out, _ = build(tmp_path, 32)
    dataset = load_dataset(out)
    by_text = {c.text: c for c in dataset.captions}
    source = {im.id: _source(out, im.id) for im in dataset.images}
    matrix = plausible_match_matrix(list(by_text.values()), dataset.images)

    def matches(text: str) -> set[str]:
        row = list(by_text).index(text)
        return {source[im.id] for im, hit in zip(dataset.images, matrix[row], strict=True) if hit}

    assert matches("An Apple") == {
        "food/fruit/apple.svg",
        "food/fruit/apple_green.svg",
    }  # fruit, tagged apple
    assert matches("a drawing of food, apple, fruit") == {
        "food/fruit/apple.svg"
    }  # only it is tagged food
    assert matches("Stop sign") == {"signs/stop.svg"}  # "apple" on a sign is another category


def test_a_second_run_renders_nothing_and_writes_the_same_files(tmp_path: Path, monkeypatch):
    out, _ = build(tmp_path, 32)
    before = {p.name: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    calls = []
    real = clipart_render.render_png
    monkeypatch.setattr(
        "models.datasets.clipart.render_png", lambda *a: calls.append(a) or real(*a)
    )
    build(tmp_path, 32)
    after = {p.name: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert len(calls) == 1  # only the blank drawing, which never made a PNG, is tried again
    assert after == before


def test_a_foreign_directory_is_refused_and_a_missing_library_explained(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "mine.txt").write_text("keep me")
    runner = CliRunner()
    result = runner.invoke(
        app,
        [
            "clipart",
            "--out",
            str(tmp_path / "out"),
            "--library",
            str(make_library(tmp_path / "svg")),
            "--quiet",
        ],
    )
    assert result.exit_code == 1 and "not empty" in result.output
    result = runner.invoke(
        app, ["clipart", "--out", str(tmp_path / "new"), "--library", str(tmp_path / "nowhere")]
    )
    assert result.exit_code == 1 and "apt-get install openclipart-svg" in result.output
    assert "Traceback" not in result.output
    (tmp_path / "new").mkdir()
    (tmp_path / "new" / "render.json").write_text("{broken")
    result = runner.invoke(app, ["clipart", "--out", str(tmp_path / "new"), "--library",
                                 str(tmp_path / "svg"), "--quiet"])  # fmt: skip
    assert result.exit_code == 1 and "not an earlier run's settings" in result.output


def test_the_command_on_a_folder_of_the_real_library_passes_data_check(tmp_path: Path) -> None:
    """Debian's openclipart-svg (scripts/bootstrap.sh installs it): the fruit folder."""
    runner = CliRunner()
    out = tmp_path / "fruit"
    result = runner.invoke(
        app,
        [
            "clipart",
            "--out",
            str(out),
            "--library",
            str(LIBRARY / "food" / "fruit"),
            "--size",
            "64",
            "--quiet",
        ],
    )
    assert result.exit_code == 0, result.output
    check = runner.invoke(app, ["check", str(out)])
    assert check.exit_code == 0, check.output
    dataset = load_dataset(out)
    assert len(dataset.images) >= 80
    assert all(dataset.captions_of(im.id) for im in dataset.images)
    assert "An Apple" in {c.text for c in dataset.captions}
    assert os.path.commonpath([im.path for im in dataset.images]) == str(out / "images")
