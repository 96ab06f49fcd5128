"""Calibration that survives a reindex: a new version inherits the active version's T and tau.

The temperature and rejection threshold are properties of the model's uncertainty, calibrated
on held-out queries; a new version of the same gallery built by the same model keeps them.
Without this, every reindex silently turned rejection off (threshold null, T 1.0).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from indexer.manifest import Calibration, Manifest, ManifestError, read_manifest
from indexer.registry import ActiveRegistry
from models.scoring.item_familiarity import ItemGate

log = logging.getLogger(__name__)

RUN_CALIBRATE = "rejection stays off until `probsearch calibrate` runs on it"


@dataclass(frozen=True)
class InheritedCalibration:
    """The calibration a new version starts with, where it came from, and why."""

    calibration: dict[str, Calibration]
    source: str | None  # the version it was copied from; None: nothing inherited
    note: str  # one sentence for the CLI and the log


def uncalibrated_metrics(manifest: Manifest) -> list[str]:
    """The metrics a version serves without a rejection threshold (rejection is off for them)."""
    return [
        metric
        for metric in manifest.metrics
        if (calibration := manifest.calibration.get(metric)) is None
        or calibration.threshold is None
    ]


def active_manifest(registry: ActiveRegistry, modality: str) -> Manifest | None:
    """The manifest of the active version of `modality`, or None (none, or unreadable)."""
    try:
        version = registry.active_version(modality)
        if version is None:
            return None
        return read_manifest(registry.version_path(modality, version))
    except (ManifestError, OSError, ValueError) as error:
        log.warning("cannot read the active %s version's manifest: %s", modality, error)
        return None


def inherit_calibration(
    active: Manifest | None, model_name: str, model_hash: str, metrics: tuple[str, ...]
) -> InheritedCalibration:
    """The calibration of `metrics` for a new version built by (model_name, model_hash).

    Each metric's Calibration is copied whole from the active version when that version was
    built by the same model; metrics it has not calibrated start uncalibrated.
    """
    fresh = {metric: Calibration() for metric in metrics}
    if active is None:
        note = f"not calibrated: no active version to inherit calibration from; {RUN_CALIBRATE}"
        return InheritedCalibration(fresh, None, note)
    if (active.model_name, active.model_hash) != (model_name, model_hash):
        other = f"{active.model_name} {active.model_hash[:12]}"
        note = (
            f"not calibrated: the active version {active.version} was built by another model "
            f"({other}); {RUN_CALIBRATE}"
        )
        return InheritedCalibration(fresh, None, note)
    calibrated = set(active.metrics) - set(uncalibrated_metrics(active))
    inherited = [metric for metric in metrics if metric in calibrated]
    if not inherited:
        note = f"not calibrated: the active version {active.version} has none; {RUN_CALIBRATE}"
        return InheritedCalibration(fresh, None, note)
    calibration = {**fresh, **{metric: active.calibration[metric] for metric in inherited}}
    note = f"inherited calibration of {', '.join(inherited)} from {active.version}"
    missing = [metric for metric in metrics if metric not in calibrated]
    if missing:
        note += f"; {', '.join(missing)} not calibrated ({RUN_CALIBRATE})"
    return InheritedCalibration(calibration, active.version, note)


def familiarity_gate(caption_gallery: Manifest | None) -> ItemGate | None:
    """The familiarity gate a caption gallery's calibration sets for image queries (the same
    for every metric: it reads no distance), or None when it has none."""
    if caption_gallery is None:
        return None
    for calibration in caption_gallery.calibration.values():
        if calibration.gate_limit is not None:
            return ItemGate(calibration.gate_score, calibration.gate_limit)
    return None
