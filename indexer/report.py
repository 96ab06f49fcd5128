"""The bad-data report of a reindex job: skipped items, why, and the fail-over-threshold check."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

MAX_LISTED_ITEMS = 10_000  # the report lists at most this many bad items (counts stay exact)

REASONS = (
    "malformed_record",  # the source line/record could not be parsed
    "unreadable_image",  # missing file, not an image, truncated, over the pixel limit
    "empty_caption",
    "caption_too_long",
    "duplicate_id",
)


class BadDataError(ValueError):
    """Too large a fraction of the gallery is unusable, or nothing is usable at all."""


@dataclass(frozen=True)
class BadItem:
    """One skipped item: its id (or source line), a reason from REASONS and a detail."""

    id: str
    reason: str
    detail: str = ""


def build_report(total: int, bad: list[BadItem]) -> dict[str, Any]:
    """The report.json content for `total` items read of which `bad` were skipped."""
    return {
        "total": total,
        "kept": total - len(bad),
        "bad": len(bad),
        "bad_fraction": len(bad) / total if total else 0.0,
        "by_reason": dict(sorted(Counter(item.reason for item in bad).items())),
        "items": [asdict(item) for item in bad[:MAX_LISTED_ITEMS]],
        "items_truncated": len(bad) > MAX_LISTED_ITEMS,
    }


def write_report(path: Path, report: dict[str, Any]) -> None:
    """Write the report as indented JSON."""
    path.write_text(json.dumps(report, indent=2), encoding="utf-8")


def check_bad_fraction(report: dict[str, Any], max_bad_fraction: float, report_path: Path) -> None:
    """Raise BadDataError when nothing is usable or too much is bad; the message says where."""
    if report["kept"] == 0:
        raise BadDataError(
            f"no usable items among {report['total']} read; see {report_path} for why"
        )
    if report["bad_fraction"] > max_bad_fraction:
        reasons = ", ".join(f"{n} {reason}" for reason, n in report["by_reason"].items())
        raise BadDataError(
            f"{report['bad']} of {report['total']} items are bad ({report['bad_fraction']:.2%}:"
            f" {reasons}), above --max-bad-fraction {max_bad_fraction}; nothing was published."
            f" Fix the source or raise the limit; details in {report_path}"
        )
