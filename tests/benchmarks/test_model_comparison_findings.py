"""The comparison's verdicts (benchmarks/model_comparison.py): inside the spread is no difference,
and each pvse model is also judged against the best Gaussian model by mean PMRP."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from model_comparison import DIRECTIONS, RUNS, Stat, findings, verdict


def test_a_gap_inside_the_larger_sd_is_no_difference_and_outside_it_is_named():
    base = Stat.of([10.0, 12.0, 14.0])  # mean 12, sd 2
    assert verdict(Stat.of([13.0, 13.5, 14.0]), base).startswith("no difference")
    assert verdict(Stat.of([15.0, 15.5, 16.0]), base).startswith("ahead by 3.5")
    assert verdict(Stat.of([6.0, 7.0, 8.0]), base).startswith("behind by 5.0")
    assert verdict(Stat.of([20.0]), base) == "not judged (needs 2+ seeds)"


def _stats(pmrp: dict[str, float]) -> dict:
    figures = ("P@1", "r_precision", "pmrp")
    stats = {}
    for name, value in pmrp.items():
        row = {f"retrieval/{d}/{f}": Stat.of([value - 0.1, value, value + 0.1])
               for d in DIRECTIONS for f in figures}  # fmt: skip
        row |= {f"nauprc/{d}/reject": Stat.of([0.1, 0.2, 0.3]) for d in DIRECTIONS}
        stats[name] = row
    return stats


def test_pvse_is_judged_against_the_gaussian_model_with_the_best_pmrp():
    pmrp = {run.name: 10.0 for run in RUNS} | {"gcie-kl": 30.0, "pvse-k2": 50.0, "pvse-k4": 40.0}
    text = "\n".join(findings(list(RUNS), _stats(pmrp)))
    assert "- pvse-k2 against gcie-kl, the Gaussian model with the best mean test PMRP:" in text
    assert "- pvse-k4 against gcie-kl" in text
    assert "PMRP ahead by 20.0 (50.0 vs 30.0" in text
    assert "reject nAUPRC no difference (0.200 vs 0.200" in text
