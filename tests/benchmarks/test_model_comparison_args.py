"""benchmarks/model_comparison.py's command line: --image-backbone swaps every selected backbone
run's image backbone and nothing else, goes only with --backbones, and the rejection plot is
named after the doc, so a comparison written to its own doc never overwrites another's plot."""

import sys

import pytest

from benchmarks.model_comparison import PRETRAINED_RUNS, parse_args


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
