"""Training: recall well above chance for gcie and vse, seeded determinism, exact resume, the
files of a model dir, and one-line errors for bad input at the CLI."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from models.cli import app
from models.datasets.records import is_plausible_match
from models.datasets.shapes import generate_shapes
from models.networks.model_config import ModelConfig
from models.networks.probabilistic_model import build_model
from models.training.train import TrainConfig, train
from models.training.training_data import epoch_batches, load_splits

from .conftest import TINY_TRAINING

MODEL_FILES = (
    "model.json",
    "checkpoint.pt",
    "vocab.json",
    "image_encoder.onnx",
    "text_encoder.onnx",
)
QUICK = TrainConfig(epochs=2, batch_size=16, lr=2e-3, seed=0)


@pytest.fixture(scope="module")
def small_shapes(tmp_path_factory) -> Path:
    """40 images: enough for fast checks of determinism, resume and errors."""
    return generate_shapes(
        tmp_path_factory.mktemp("small") / "shapes", 40, seed=1, progress=False, workers=1
    )


def chance_recall_at_1(model_dir: Path) -> float:
    """R@1 (%) of a random ranking; the same in both directions (one image per caption, and
    an image's captions are 1 / N_img of all captions)."""
    return 100.0 / json.loads((model_dir / "model.json").read_text())["training"]["val_images"]


def assert_beats_chance(model_dir: Path, factor: float = 3.0) -> None:
    """Exact-pair R@10 of the kept checkpoint at least `factor` x that of a random ranking."""
    validation = json.loads((model_dir / "model.json").read_text())["validation"]
    chance = 10 * chance_recall_at_1(model_dir)
    for direction in ("i2t", "t2i"):
        assert validation["recalls"][f"{direction}_R@10"] >= factor * chance, validation


def test_model_dir_holds_every_file(tiny_model_dir) -> None:
    for name in MODEL_FILES:
        assert (tiny_model_dir / name).is_file(), name
    config = ModelConfig.load(tiny_model_dir)
    assert config.vocab_size > 10 and config.training["epochs"] == TINY_TRAINING.epochs
    history = json.loads((tiny_model_dir / "history.json").read_text())
    assert len(history) == TINY_TRAINING.epochs
    assert history[-1]["loss"] < history[0]["loss"]


def test_gcie_recall_is_at_least_three_times_chance(tiny_model_dir) -> None:
    assert_beats_chance(tiny_model_dir)


@pytest.mark.slow
def test_vse_recall_is_at_least_twice_chance(shapes_dir, tmp_path) -> None:
    """Twice, not three times: over seeds 0-2 on CPU and on CUDA this run's R@10 spans 2.7 to
    4.8 x chance (benchmarks/results/gpu_model_tests.md), so 3x sat inside the seed spread and
    failed on an H100 for seed 0."""
    out = tmp_path / "vse"
    train(
        shapes_dir,
        out,
        ModelConfig(model_type="vse", embed_dim=16),
        TINY_TRAINING,
        progress=False,
        export=False,
        log=lambda line: None,
    )
    assert_beats_chance(out, factor=2.0)


def state_of(model_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(model_dir / "last.pt", weights_only=True)["model"]


def test_training_is_seeded_and_resume_repeats_an_uninterrupted_run(small_shapes, tmp_path) -> None:
    config = ModelConfig(embed_dim=8)
    straight, resumed, other = tmp_path / "straight", tmp_path / "resumed", tmp_path / "other"
    quiet = {"progress": False, "export": False, "log": lambda line: None}
    train(small_shapes, straight, config, QUICK, **quiet)
    train(small_shapes, resumed, config, TrainConfig(**{**QUICK.__dict__, "epochs": 1}), **quiet)
    assert len(json.loads((resumed / "history.json").read_text())) == 1
    result = train(small_shapes, resumed, config, QUICK, resume=True, **quiet)
    assert len(result.history) == 2
    train(small_shapes, other, config, TrainConfig(**{**QUICK.__dict__, "seed": 1}), **quiet)
    for name, tensor in state_of(straight).items():
        torch.testing.assert_close(state_of(resumed)[name], tensor, rtol=0, atol=0)
    assert any(not torch.equal(state_of(other)[n], t) for n, t in state_of(straight).items())


def invoke_train(data: Path, out: Path, *extra: str):
    args = [
        "train",
        "--data",
        str(data),
        "--out",
        str(out),
        "--epochs",
        "1",
        "--batch-size",
        "16",
        "--no-progress",
        *extra,
    ]
    return CliRunner().invoke(app, args)


def test_cli_trains_and_prints_one_line_per_epoch(small_shapes, tmp_path) -> None:
    result = invoke_train(small_shapes, tmp_path / "m", "--model-type", "gce", "--embed-dim", "8")
    assert result.exit_code == 0, result.output
    assert "epoch   1  loss" in result.output and "P@1 i2t/t2i" in result.output
    assert ModelConfig.load(tmp_path / "m").metric == "mahalanobis"
    again = invoke_train(small_shapes, tmp_path / "m")
    assert again.exit_code == 2 and "--resume" in again.output


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (("--model-type", "gcx"), "unknown model type 'gcx'"),
        (("--metric", "mahalanobis"), "metric 'mahalanobis' cannot train a gcie model"),
        (("--metric", "euclid"), "metric 'euclid' cannot train"),
        (("--covariance", "full"), "unknown covariance"),
        (("--resume",), "nothing to resume"),
        (("--cnn-downsample", "avg"), "unknown cnn downsample 'avg'"),
        (("--stem-stride", "3"), "stem stride must be 1 or 2"),
        (("--model-type", "pvse", "--label-weight", "0.5"), "not supported for pvse"),
        (("--model-type", "pvse", "--outlier-fraction", "0.5"), "not supported for pvse"),
        (("--objective", "pcme", "--outlier-fraction", "0.25"), "hinge objective only"),
        (("--outlier-fraction", "2"), "outlier fraction must be in [0, 1]"),
        (("--model-type", "pvse", "--counterfactual-weight", "1"), "not supported for pvse"),
        (("--counterfactual-weight", "-1"), "regulariser weights must be >= 0"),
        (("--counterfactuals", "words"), "unknown counterfactuals 'words'"),
        (("--caption-swaps", "size,weight"), "unknown caption swaps 'size,weight'"),
        (("--model-type", "pvse", "--attribute-weight", "1"), "not supported for pvse"),
        (("--attribute-weight", "-1"), "regulariser weights must be >= 0"),
    ],
)
def test_cli_bad_options_are_one_line_errors(small_shapes, tmp_path, extra, message) -> None:
    result = invoke_train(small_shapes, tmp_path / "m", *extra)
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1


def test_cli_refuses_swapped_images_of_data_it_cannot_render(small_shapes, tmp_path) -> None:
    other = tmp_path / "other"
    shutil.copytree(small_shapes, other)
    meta = json.loads((other / "dataset.json").read_text())
    (other / "dataset.json").write_text(json.dumps({**meta, "name": "photos"}))
    result = invoke_train(other, tmp_path / "m", "--counterfactual-weight", "1")
    assert (
        result.exit_code == 2 and "counterfactual images need the shapes dataset" in result.output
    )
    assert "Traceback" not in result.output
    captions_only = invoke_train(
        other, tmp_path / "c", "--counterfactual-weight", "1", "--counterfactuals", "captions"
    )
    assert captions_only.exit_code == 0, captions_only.output


def test_cli_refuses_attributes_of_data_without_objects(small_shapes, tmp_path) -> None:
    bare = tmp_path / "bare"
    shutil.copytree(small_shapes, bare)
    lines = (bare / "images.jsonl").read_text().splitlines()
    records = [{k: v for k, v in json.loads(line).items() if k != "objects"} for line in lines]
    (bare / "images.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    result = invoke_train(bare, tmp_path / "m", "--attribute-weight", "1")
    assert result.exit_code == 2, result.output
    assert "attribute_weight needs a dataset with object annotations" in result.output
    assert "Traceback" not in result.output


def test_cli_reports_missing_captions_and_corrupt_images(small_shapes, tmp_path) -> None:
    no_captions = tmp_path / "no-captions"
    shutil.copytree(small_shapes, no_captions)
    (no_captions / "captions.jsonl").unlink()
    result = invoke_train(no_captions, tmp_path / "a")
    assert result.exit_code == 2 and "captions.jsonl" in result.output
    (no_captions / "captions.jsonl").write_text("")
    result = invoke_train(no_captions, tmp_path / "b")
    assert result.exit_code == 2 and "no train captions" in result.output

    corrupt = tmp_path / "corrupt"
    shutil.copytree(small_shapes, corrupt)
    victim = json.loads((corrupt / "images.jsonl").read_text().splitlines()[0])
    (corrupt / victim["file"]).write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    result = invoke_train(corrupt, tmp_path / "c")
    assert result.exit_code == 2
    assert victim["id"] in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("batches", [1, 3])
def test_batch_plausible_matches_the_dataset_judgement(small_shapes, batches) -> None:
    """Also after earlier batches filled the split's memo of judged descriptor sets."""
    train_split, _, _ = load_splits(small_shapes, ModelConfig(embed_dim=8))
    generator = torch.Generator().manual_seed(batches)
    for _ in range(batches):
        image_rows = torch.randperm(train_split.num_images, generator=generator)[:6]
        caption_rows = torch.randperm(train_split.num_captions, generator=generator)[:9]
        matrix = train_split.batch_plausible(image_rows, caption_rows)
        for b, image_row in enumerate(image_rows.tolist()):
            for m, caption_row in enumerate(caption_rows.tolist()):
                caption = train_split.caption_records[caption_row]
                image = train_split.image_records[image_row]
                assert bool(matrix[b, m]) is is_plausible_match(caption, image)
    rows = torch.tensor([0, 3]), torch.nonzero(train_split.caption_image == 3).flatten()
    matrix = train_split.batch_plausible(*rows)
    assert bool(matrix[1].all())  # a caption always plausibly describes its own image


def test_spread_variance_training_runs_and_reports_variance_health(small_shapes, tmp_path):
    config = TrainConfig(epochs=1, batch_size=16, variance_objective="spread", patience=0)
    model = ModelConfig(embed_dim=8, metric="cosine", variance_reads_only=True)
    result = train(small_shapes, tmp_path / "m", model, config, progress=False, export=False,
                   log=lambda line: None)  # fmt: skip
    assert 0.0 <= result.history[0]["at_bound"] <= 1.0
    assert result.history[0]["log_det_caption"] != result.history[0]["log_det_image"]


def test_image_probes_train_resume_and_stay_out_of_the_model(small_shapes, tmp_path) -> None:
    """The probes' weights travel in last.pt (a resumed run repeats an uninterrupted one), the
    label and attribute losses change the encoders, and the model dir holds no trace of them."""
    config = ModelConfig(embed_dim=8, image_pooling="objects", cnn_downsample="maxpool")
    labelled = TrainConfig(**{**QUICK.__dict__, "label_weight": 1.0, "attribute_weight": 1.0})
    quiet = {"progress": False, "export": False, "log": lambda line: None}
    straight, resumed, plain = tmp_path / "straight", tmp_path / "resumed", tmp_path / "plain"
    train(small_shapes, straight, config, labelled, **quiet)
    train(small_shapes, resumed, config, TrainConfig(**{**labelled.__dict__, "epochs": 1}), **quiet)
    train(small_shapes, resumed, config, labelled, resume=True, **quiet)
    train(small_shapes, plain, config, QUICK, **quiet)
    for name, tensor in state_of(straight).items():
        torch.testing.assert_close(state_of(resumed)[name], tensor, rtol=0, atol=0)
    probes = torch.load(straight / "last.pt", weights_only=True)["probes"]
    assert probes["labels.linear.weight"].shape == (30, 8)  # 30 colour-shape labels, off mu
    # 5 shapes + 6 colours + 2 sizes, off the trunk's features
    assert probes["attributes.linear.weight"].shape == (13, config.image_features)
    assert any(not torch.equal(state_of(plain)[n], t) for n, t in state_of(straight).items())
    checkpoint = torch.load(straight / "checkpoint.pt", weights_only=True)["state_dict"]
    assert set(checkpoint) == set(build_model(ModelConfig.load(straight)).state_dict())


def test_outliers_join_the_batches_seeded(small_shapes, tmp_path) -> None:
    """Synthetic outliers change what is learnt, and a run with them is repeatable; what they
    do to the variance is checked in test_objectives and measured on photographs by
    benchmarks/recipe_seeds.py."""
    plain = TrainConfig(**{**QUICK.__dict__, "variance_objective": "spread"})
    outliers = TrainConfig(**{**plain.__dict__, "outlier_fraction": 0.5})
    changed = seeded_and_changed(small_shapes, tmp_path, outliers, plain)
    assert any(n.startswith("image_encoder.heads.logvar") for n in changed), changed


def seeded_and_changed(
    data: Path, tmp_path: Path, variant: TrainConfig, plain: TrainConfig
) -> list[str]:
    """Train `variant` twice (asserting identical weights: it is seeded) and `plain` once;
    the names of the weights where `variant` and `plain` differ."""
    config = ModelConfig(embed_dim=8, metric="cosine", variance_reads_only=True)
    quiet = {"progress": False, "export": False, "log": lambda line: None}
    train(data, tmp_path / "a", config, variant, **quiet)
    train(data, tmp_path / "b", config, variant, **quiet)
    train(data, tmp_path / "plain", config, plain, **quiet)
    for name, tensor in state_of(tmp_path / "a").items():
        torch.testing.assert_close(state_of(tmp_path / "b")[name], tensor, rtol=0, atol=0)
    return [n for n, t in state_of(tmp_path / "plain").items()
            if not torch.equal(state_of(tmp_path / "a")[n], t)]  # fmt: skip


def test_caption_swaps_choose_the_swapped_words(small_shapes) -> None:
    """Only the asked attributes are swapped: size swaps alone are fewer than all three."""
    config = ModelConfig(embed_dim=8)
    everything = load_splits(small_shapes, config, None, 0, "captions")[0].counterfactuals
    sizes = load_splits(small_shapes, config, None, 0, "captions", ("size",))[0].counterfactuals
    assert everything is not None and sizes is not None
    assert 0 < len(sizes.caption) < len(everything.caption)
    assert len(sizes.caption) == len(set(sizes.caption.tolist()))  # at most one per caption


def test_a_batch_gets_the_swaps_of_its_own_captions(small_shapes) -> None:
    train_split, val_split, _ = load_splits(small_shapes, ModelConfig(embed_dim=8), None, 0)
    swaps = train_split.counterfactuals
    assert val_split.counterfactuals is None and swaps is not None and len(swaps.caption) > 40
    caption_rows = torch.tensor([31, 2, 20, 11, 1])
    ids, lengths, position = swaps.of(caption_rows)
    rows = caption_rows.tolist()
    expected = [(m, k) for k, c in enumerate(swaps.caption.tolist()) for m in range(len(rows))
                if rows[m] == c]  # fmt: skip
    assert len(expected) == len(position) > 0
    for (m, k), at, got, length in zip(expected, position, ids, lengths, strict=True):
        assert int(at) == m and int(length) == int(swaps.lengths[k])
        assert torch.equal(got[:length], swaps.ids[k, :length])


def test_a_batch_gets_the_swapped_images_of_its_own_captions(small_shapes) -> None:
    """Each image carries a re-render with one shape swapped (new pixels exactly where one of
    its captions is flagged as missed); a batch is given the swapped image of every caption
    the swap makes miss, and no other."""
    config = ModelConfig(embed_dim=8)
    train_split, _, _ = load_splits(small_shapes, config, None, 0, "images")
    swaps = train_split.image_counterfactuals
    assert train_split.counterfactuals is None and swaps is not None
    assert swaps.misses.float().mean() > 0.3
    for row, image in enumerate(train_split.image_records):
        captions = (train_split.caption_image == row).nonzero().squeeze(1)
        same = torch.equal(swaps.pixels[row], train_split.pixels[row])
        assert same == (not swaps.misses[captions].any())
        for c in captions.tolist():
            if swaps.misses[c]:
                assert is_plausible_match(train_split.caption_records[c], image)
    image_rows, caption_rows, owner = next(epoch_batches(train_split, 6, 0, 0, 0))
    swapped, missed, position = swaps.of(image_rows, caption_rows, owner)
    assert missed.tolist() == [m for m, c in enumerate(caption_rows.tolist()) if swaps.misses[c]]
    assert swapped[position].tolist() == image_rows[owner[missed]].tolist()


def test_counterfactuals_change_what_is_learnt_and_are_seeded(small_shapes, tmp_path) -> None:
    swapped = TrainConfig(**{**QUICK.__dict__, "counterfactual_weight": 1.0})
    changed = seeded_and_changed(small_shapes, tmp_path, swapped, QUICK)
    assert any(n.startswith("image_encoder.blocks") for n in changed), changed


def test_moving_average_is_what_is_kept_and_resumes_exactly(small_shapes, tmp_path, monkeypatch):
    """ema_decay keeps the exponential moving average of the weights after every step,
    computed here by hand from the weights each step leaves, starting at the first step's."""
    import models.training.train as train_module

    decay, after_steps = 0.7, []
    step = train_module._step

    def recording_step(model, optimizer, loss, config):
        value = step(model, optimizer, loss, config)
        after_steps.append({n: p.detach().clone() for n, p in model.named_parameters()})
        return value

    monkeypatch.setattr(train_module, "_step", recording_step)
    config, ema = ModelConfig(embed_dim=8), TrainConfig(**{**QUICK.__dict__, "ema_decay": decay})
    quiet = {"progress": False, "export": False, "log": lambda line: None}
    train(small_shapes, tmp_path / "ema", config, TrainConfig(**{**ema.__dict__, "epochs": 1}),
          **quiet)  # fmt: skip
    expected = dict(after_steps[0])
    for weights in after_steps[1:]:
        expected = {n: decay * expected[n] + (1 - decay) * w for n, w in weights.items()}
    kept = kept_weights(tmp_path / "ema")
    assert len(after_steps) > 1
    for name, tensor in expected.items():
        torch.testing.assert_close(kept[name], tensor, rtol=1e-5, atol=1e-6)
    assert any(not torch.equal(kept[n], w) for n, w in after_steps[-1].items())
    trained = state_of(tmp_path / "ema")  # the weights as trained, after the same single epoch
    buffers = [n for n in trained if n.endswith("running_mean") or n.endswith("running_var")]
    assert buffers
    for name in buffers:  # batch-norm statistics are the trained model's, not averaged
        torch.testing.assert_close(kept[name], trained[name], rtol=0, atol=0)
    monkeypatch.setattr(train_module, "_step", step)
    train(small_shapes, tmp_path / "ema", config, ema, resume=True, **quiet)
    train(small_shapes, tmp_path / "straight", config, ema, **quiet)
    for name, tensor in kept_weights(tmp_path / "straight").items():
        torch.testing.assert_close(kept_weights(tmp_path / "ema")[name], tensor, rtol=0, atol=0)


def kept_weights(model_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(model_dir / "checkpoint.pt", weights_only=True)["state_dict"]


def test_moving_average_decay_outside_0_1_is_refused() -> None:
    from models.networks.model_config import ConfigError

    with pytest.raises(ConfigError, match="ema_decay"):
        TrainConfig(ema_decay=1.0)


def test_weight_decay_shrinks_the_encoders_alone_decoupled_from_the_gradient() -> None:
    """With a zero gradient AdamW's step is the decay alone: every encoder weight times
    1 - lr * weight_decay (Loshchilov and Hutter), the match logit's a and b untouched; with
    weight_decay 0 the optimiser is plain Adam, as before the option."""
    from models.training.train import _optimizer, parameter_groups

    model = build_model(ModelConfig(model_type="gcie", metric="csd", vocab_size=20))
    config = TrainConfig(lr=0.1, weight_decay=0.5)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = _optimizer(parameter_groups(model, config), config)
    assert isinstance(optimizer, torch.optim.AdamW)
    (0.0 * sum(p.sum() for p in model.parameters())).backward()
    optimizer.step()
    for name, param in model.named_parameters():
        factor = 1.0 if name in ("match_log_scale", "match_shift") else 1.0 - 0.1 * 0.5
        torch.testing.assert_close(param.detach(), before[name] * factor)
    plain = TrainConfig(lr=0.1)
    assert type(_optimizer(parameter_groups(model, plain), plain)) is torch.optim.Adam


def test_negative_weight_decay_is_refused() -> None:
    from models.networks.model_config import ConfigError

    with pytest.raises(ConfigError, match="weight_decay"):
        TrainConfig(weight_decay=-0.1)
