"""benchmarks/heads_val_sweep.py: a variant is a model_comparison run with settings changed in
the right config, and a setting that is in neither config is refused."""

import pytest

from benchmarks.heads_val_sweep import parse_variant
from benchmarks.model_comparison import PRETRAINED_RUNS, RUNS


def test_a_variant_changes_only_what_it_names() -> None:
    base = next(run for run in PRETRAINED_RUNS if run.name == "pcmepp")
    variant = parse_variant(
        "fast=pcmepp,lr=0.0005,embed_dim=128,positives=plausible", PRETRAINED_RUNS
    )
    assert variant.name == "fast"
    assert variant.model == {**base.model, "embed_dim": 128}
    assert variant.training == {**base.training, "lr": 0.0005, "positives": "plausible"}
    assert (variant.metric, variant.extra) == (base.metric, base.extra)


def test_a_bare_name_is_the_run_itself() -> None:
    base = next(run for run in RUNS if run.name == "pcme")
    assert parse_variant("pcme", RUNS) == base


@pytest.mark.parametrize(
    "spec", ["pcmepp=nothing,lr=1", "x=pcmepp,learning_rate=1", "gcie-count-nce"]
)
def test_an_unknown_run_or_setting_is_refused(spec: str) -> None:
    with pytest.raises(SystemExit, match="--variant"):
        parse_variant(spec, RUNS)
