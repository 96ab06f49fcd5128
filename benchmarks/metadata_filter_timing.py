"""How long a metadata filter takes to pick its rows (MetadataFilter.matching_rows) over a
version's metadata.sqlite of 200,000 picture rows, one filter shape per line.

Usage: .venv/bin/python benchmarks/metadata_filter_timing.py [--rows 200000] [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import random
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any

from result_header import result_header

from indexer.metadata_filter import MetadataFilter
from indexer.version_writer import MetadataWriter

ROUNDS = 3


def picture_rows(count: int, seed: int = 0) -> list[dict[str, Any]]:
    """`count` picture records with a split, three of 100 labels, a year and a price."""
    rng = random.Random(seed)
    labels = [f"label{i}" for i in range(100)]
    return [
        {
            "id": f"item{i}",
            "uri": f"img/{i}.jpg",
            "extra": {
                "split": rng.choice(["train", "val", "test"]),
                "labels": rng.sample(labels, 3),
                "year": rng.randint(1990, 2025),
                "price": rng.random() * 100,
            },
        }
        for i in range(count)
    ]


FILTERS: list[dict[str, Any]] = [
    {"split": "test"},
    {"labels": "label7"},
    {"labels": {"in": [f"label{i}" for i in range(50)]}},
    {"year": {"gte": 2000, "lt": 2010}},
    {"split": "test", "labels": "label7", "price": {"lt": 50}},
    {"id": {"in": [f"item{i}" for i in range(1000)]}},
]


def time_filters(db: sqlite3.Connection, count: int) -> list[tuple[str, float, int]]:
    """(filter, best of ROUNDS seconds, matching rows) per filter of FILTERS."""
    rows = []
    for spec in FILTERS:
        flt = MetadataFilter.parse(spec)
        took = []
        for _ in range(ROUNDS):
            start = time.perf_counter()
            mask = flt.matching_rows(db, count)
            took.append(time.perf_counter() - start)
        rows.append((flt.describe(), min(took), int(mask.sum())))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument(
        "--out", type=Path,
        default=Path(__file__).parent / "results" / "metadata_filter_timing.md",
    )  # fmt: skip
    args = parser.parse_args()
    load, started = os.getloadavg(), time.perf_counter()
    items = picture_rows(args.rows)
    with tempfile.TemporaryDirectory() as tmp:
        writer = MetadataWriter(Path(tmp) / "metadata.sqlite")
        writer.add(items)
        writer.close()
        db = sqlite3.connect(Path(tmp) / "metadata.sqlite")
        timings = time_filters(db, len(items))
        version = sqlite3.sqlite_version
        db.close()
    lines = result_header(f"Metadata filters over {args.rows:,} rows", load, started)
    lines += [
        "",
        f"sqlite {version}; best of {ROUNDS} calls of MetadataFilter.matching_rows per filter.",
        "",
        "| filter | best of 3 (ms) | rows matched |",
        "| --- | ---: | ---: |",
    ]
    lines += [f"| `{what[:80]}` | {s * 1000:.1f} | {n} |" for what, s, n in timings]
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
