"""How far PMRP's plausible sets agree with the dataset's own plausible matches.

PMRP (Chun et al.) counts an (image, caption) pair as a match when the label vectors of the
image and of the caption's own image differ in at most zeta positions. On shapes data a caption
often describes one object of a scene, so a caption can be PMRP-relevant to an image it is not
true of. For each zeta and direction this prints how many items are PMRP-relevant per query, the
share of them that are plausible matches (models.datasets.records.is_plausible_match), and the
share of the plausible matches that PMRP counts. No model is involved.

    .venv/bin/python benchmarks/pmrp_agreement.py --data runs/seeds11/data-s11-n3000 --split test
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from models.datasets.records import load_dataset, plausible_match_matrix
from models.evaluation.evaluate import image_label_matrix
from models.evaluation.retrieval_metrics import pmrp_relevances


def agreement(data: Path, split: str) -> list[str]:
    """Markdown rows: direction, zeta, relevant per query, % plausible, % of plausible counted."""
    dataset = load_dataset(data, split)
    labels = image_label_matrix(dataset)
    row_of = {image.id: row for row, image in enumerate(dataset.images)}
    caption_labels = labels[[row_of[c.image_id] for c in dataset.captions]]
    plausible = plausible_match_matrix(dataset.captions, dataset.images)  # (C, I)
    rows = []
    for direction, queries, gallery, truth in (
        ("i2t", labels, caption_labels, plausible.T),
        ("t2i", caption_labels, labels, plausible),
    ):
        for name, relevance in pmrp_relevances(queries, gallery).items():
            mask = relevance.mask(np.arange(len(queries)))
            both = float((mask & truth).sum())
            rows.append(
                f"| {direction} | {name.removeprefix('pmrp_zeta')} | {mask.sum(1).mean():.1f} "
                f"| {truth.sum(1).mean():.1f} | {100 * both / mask.sum():.1f} "
                f"| {100 * both / truth.sum():.1f} |"
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--split", default="test")
    args = parser.parse_args()
    print(f"Data `{args.data}`, split {args.split}.\n")
    print("| direction | zeta | PMRP-relevant per query | plausible per query "
          "| relevant that are plausible (%) | plausible that are relevant (%) |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- |")
    print("\n".join(agreement(args.data, args.split)))


if __name__ == "__main__":
    main()
