"""benchmarks/model_comparison.py's command line: --image-backbone swaps every selected backbone
run's image backbone and nothing else, goes only with --backbones, and the rejection plot is
named after the doc, so a comparison written to its own doc never overwrites another's plot;
--data-from seeds the work dir with a clip-art dataset already made, and nothing else."""

import json
import sys

import pytest

from benchmarks.model_comparison import PRETRAINED_RUNS, parse_args, prepare_data


def parsed(monkeypatch, *argv: str):
    monkeypatch.setattr(sys, "argv", ["model_comparison.py", *argv])
    return parse_args()


def test_image_backbone_replaces_only_the_image_backbone(monkeypatch) -> None:
    args = parsed(monkeypatch, "--dataset", "clipart", "--backbones", "--runs", "vse,pcme",
                  "--image-backbone", "efficientnet-lite0-style")  # fmt: skip
    own = {run.name: run for run in PRETRAINED_RUNS}
    assert [run.name for run in args.selected] == ["vse", "pcme"]
    for run in args.selected:
        assert run.model == {**own[run.name].model, "image_backbone": "efficientnet-lite0-style"}
        assert (run.training, run.metric) == (own[run.name].training, own[run.name].metric)


def test_without_it_the_runs_are_their_own(monkeypatch) -> None:
    args = parsed(monkeypatch, "--dataset", "clipart", "--backbones", "--runs", "vse")
    assert args.selected == [run for run in PRETRAINED_RUNS if run.name == "vse"]


def test_image_backbone_needs_backbones(monkeypatch) -> None:
    with pytest.raises(SystemExit):
        parsed(monkeypatch, "--dataset", "clipart", "--image-backbone", "efficientnet-lite0-style")


@pytest.mark.parametrize(
    ("argv", "plot"),
    [
        ((), "rejection.png"),
        (("--dataset", "clipart"), "rejection-clipart.png"),
        (("--dataset", "clipart", "--backbones"), "rejection-clipart-backbones.png"),
        (("--dataset", "clipart", "--backbones", "--doc", "docs/results-clipart-style.md"),
         "rejection-clipart-style.png"),
    ],
)  # fmt: skip
def test_the_plot_is_named_after_the_doc(monkeypatch, argv, plot) -> None:
    assert parsed(monkeypatch, *argv).plot_name == plot


def test_data_from_copies_a_clipart_dataset_into_the_work_dir(monkeypatch, tmp_path) -> None:
    source = tmp_path / "demo-data"
    (source / "features").mkdir(parents=True)
    (source / "dataset.json").write_text('{"name": "clipart"}')
    (source / "features" / "val-text.npz").write_bytes(b"cached")
    work = tmp_path / "work"
    args = parsed(monkeypatch, "--dataset", "clipart", "--data-from", str(source),
                  "--work-dir", str(work))  # fmt: skip
    data, _, reused = prepare_data(work, args)
    assert data == work / "data" and not reused
    assert (data / "features" / "val-text.npz").read_bytes() == b"cached"
    (source / "dataset.json").write_text('{"name": "changed"}')  # now the marker says reuse
    assert prepare_data(work, args)[2] and json.loads((data / "dataset.json").read_text()) == {
        "name": "clipart"
    }


@pytest.mark.parametrize(
    ("dataset", "content", "message"),
    [
        ("shapes", '{"name": "clipart"}', "only with --dataset clipart"),
        ("clipart", '{"name": "shapes"}', "not clip art"),
        ("clipart", None, "no readable dataset.json"),
    ],
)
def test_data_from_refuses_what_is_not_clip_art(monkeypatch, tmp_path, capsys, dataset,
                                                content, message) -> None:  # fmt: skip
    if content is not None:
        (tmp_path / "dataset.json").write_text(content)
    with pytest.raises(SystemExit):
        parsed(monkeypatch, "--dataset", dataset, "--data-from", str(tmp_path))
    assert message in capsys.readouterr().err
