"""Which calibration a new version starts with: copied whole from the same model's active one."""

from dataclasses import replace

from indexer.calibration_inheritance import inherit_calibration, uncalibrated_metrics
from indexer.manifest import Calibration, Manifest

METRICS = ("w2", "kl", "min_kl")


def manifest(calibration: dict[str, Calibration], model_hash: str = "h" * 64) -> Manifest:
    return Manifest(
        version="v1", modality="image", model_name="m", model_hash=model_hash, dim=8, count=10,
        metrics=METRICS, families=("w2", "kl", "kl_reverse"), index_type="flat",
        index_params={}, search_params={}, calibration=calibration, created_at="now",
    )  # fmt: skip


CALIBRATED = {"w2": Calibration(0.1, 0.4), "kl": Calibration(0.3, 1.5)}


def test_same_model_copies_each_calibration_object_whole() -> None:
    active = manifest({**CALIBRATED, "min_kl": Calibration()})
    got = inherit_calibration(active, "m", "h" * 64, ("w2", "kl", "min_kl", "js"))
    assert got.source == "v1"
    assert got.calibration["w2"] is active.calibration["w2"]  # every field travels, new ones too
    assert got.calibration["kl"] is active.calibration["kl"]
    assert got.calibration["min_kl"] == got.calibration["js"] == Calibration()
    assert got.note.startswith("inherited calibration of w2, kl from v1; min_kl, js not calibrated")


def test_another_model_or_no_calibration_inherits_nothing_and_says_so() -> None:
    other = inherit_calibration(manifest(CALIBRATED), "m", "x" * 64, METRICS)
    none_yet = inherit_calibration(manifest({}), "m", "h" * 64, METRICS)
    no_active = inherit_calibration(None, "m", "h" * 64, METRICS)
    for got, reason in [(other, "built by another model"), (none_yet, "has none"),
                        (no_active, "no active version")]:  # fmt: skip
        assert got.source is None and reason in got.note and "probsearch calibrate" in got.note
        assert all(c == Calibration() for c in got.calibration.values())
        assert set(got.calibration) == set(METRICS)


def test_uncalibrated_metrics_are_those_without_a_threshold() -> None:
    m = manifest({**CALIBRATED, "min_kl": Calibration(2.0, None)})
    assert uncalibrated_metrics(m) == ["min_kl"]
    assert uncalibrated_metrics(replace(m, calibration={})) == list(METRICS)
