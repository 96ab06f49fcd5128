"""benchmarks/heads_val_sweep.py: a variant is a model_comparison run with settings changed in
the right config, a setting that is in neither config is refused, and a seed's cached figures
are reused only for the same effective configs."""

import json
from pathlib import Path

import pytest

from benchmarks.heads_val_sweep import FIGURES, parse_variant, run_metric, run_seed
from benchmarks.model_comparison import PRETRAINED_RUNS, RUNS, effective_configs
from models.datasets.records import DatasetError


def test_a_variant_changes_only_what_it_names() -> None:
    base = next(run for run in PRETRAINED_RUNS if run.name == "pcmepp")
    variant = parse_variant(
        "fast=pcmepp,lr=0.0005,embed_dim=128,positives=plausible", PRETRAINED_RUNS
    )
    assert variant.name == "fast"
    assert variant.model == {**base.model, "embed_dim": 128}
    assert variant.training == {**base.training, "lr": 0.0005, "positives": "plausible"}
    assert (variant.metric, variant.extra) == (base.metric, base.extra)


@pytest.mark.parametrize(
    ("spec", "metric"),
    [
        ("gcie-count-nce", "w2"),
        ("gcie-count-qm", "query_mahalanobis"),
        ("x=gcie-count-nce,search_with=kl", "kl"),
    ],
)
def test_a_variant_is_ranked_with_what_its_model_searches_with(spec: str, metric: str) -> None:
    assert run_metric(parse_variant(spec, PRETRAINED_RUNS)) == metric


def test_a_bare_name_is_the_run_itself() -> None:
    base = next(run for run in RUNS if run.name == "pcme")
    assert parse_variant("pcme", RUNS) == base


@pytest.mark.parametrize(
    "spec", ["pcmepp=nothing,lr=1", "x=pcmepp,learning_rate=1", "gcie-count-nce"]
)
def test_an_unknown_run_or_setting_is_refused(spec: str) -> None:
    with pytest.raises(SystemExit, match="--variant"):
        parse_variant(spec, RUNS)


def test_cached_figures_are_reused_only_for_the_same_effective_configs(tmp_path: Path) -> None:
    run = parse_variant("pcme", RUNS)
    _, _, configs = effective_configs(run, seed=1, epochs=3)
    cached = {"configs": configs} | dict.fromkeys(FIGURES, 12.5)
    (tmp_path / "val_figures.json").write_text(json.dumps(cached))
    missing = tmp_path / "no-dataset"  # training would fail on it
    assert run_seed(missing, tmp_path, run, 1, 3) == cached

    without_rho = {k: v for k, v in cached.items() if k != "t2i_log-det_rho"}
    (tmp_path / "val_figures.json").write_text(json.dumps(without_rho))  # an older figure set
    with pytest.raises(DatasetError, match="no-dataset"):
        run_seed(missing, tmp_path, run, 1, 3)

    configs["training"]["match_lr"] = 0.05  # made under another default: train again
    (tmp_path / "val_figures.json").write_text(json.dumps({**cached, "configs": configs}))
    with pytest.raises(DatasetError, match="no-dataset"):
        run_seed(missing, tmp_path, run, 1, 3)
