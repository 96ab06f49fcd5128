"""benchmarks/model_comparison.py reuses a trained model only when it was trained with the same
effective configs: a default changed since (PCME's uniformity weight, say) trains it again,
though the run's overrides are the same."""

import argparse
import json
from pathlib import Path

import pytest

from benchmarks.model_comparison import RUNS, effective_configs, save_marker, train_run
from models.datasets.records import DatasetError

ARGS = argparse.Namespace(epochs=3, dataset="shapes", images=200, data_seed=0)


def _trained(work: Path, configs: dict) -> Path:
    out = work / "models" / "pcme" / "seed1"
    save_marker(out / "comparison.json", {**configs, "data": {"images": 200, "seed": 0}}, {
        "seconds": 1.0, "best_epoch": 2, "epochs_run": 3,
    })  # fmt: skip
    (out / "text_encoder.onnx").write_bytes(b"")
    return out


def test_a_model_trained_with_the_same_effective_configs_is_reused(tmp_path: Path) -> None:
    run = next(run for run in RUNS if run.name == "pcme")
    _, _, configs = effective_configs(run, seed=1, epochs=3)
    out = _trained(tmp_path, configs)
    missing = tmp_path / "no-dataset"  # training would fail on it
    reused = train_run(run, missing, tmp_path, ARGS, seed=1)
    assert reused == {"seconds": 1.0, "best_epoch": 2, "epochs_run": 3, "dir": str(out),
                      "reused": True}  # fmt: skip


def test_a_model_trained_under_another_default_is_trained_again(tmp_path: Path) -> None:
    run = next(run for run in RUNS if run.name == "pcme")
    _, _, configs = effective_configs(run, seed=1, epochs=3)
    assert "uniformity_weight" not in run.training  # the same overrides, another default
    configs["training"]["uniformity_weight"] = 0.0
    _trained(tmp_path, json.loads(json.dumps(configs)))
    with pytest.raises(DatasetError, match="no-dataset"):
        train_run(run, tmp_path / "no-dataset", tmp_path, ARGS, seed=1)
