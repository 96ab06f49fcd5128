"""The comparison's verdicts (benchmarks/model_comparison.py): inside the spread is no difference,
and each pvse model is also judged against the best Gaussian model by mean PMRP."""

import math
import sys
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from model_comparison import (
    BASELINES,
    DIRECTIONS,
    RUNS,
    SeedResult,
    Stat,
    aggregate,
    baseline_findings,
    baseline_line,
    findings,
    ood_section,
    uncertainty_figures,
    uncertainty_section,
    val_choices,
    verdict,
)


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


# ---- the training-free baselines: reported beside the reject score, never chosen as it -----

LEARNED = ("log_det", "entropy", "feature_uncertainty", "top_mahalanobis")
LEARNED += tuple(f"{s}@T{t}" for s in ("mutual_information", "posterior_entropy") for t in (0.1, 1))


def _report(nauprc: dict[str, float], metric: str = "w2") -> dict:
    """A val or test report with these normalised AUPRCs in both directions (and as Spearman
    and OOD AUROC)."""
    rejection = {n: {"normalized_auprc": v} for n, v in nauprc.items()}
    rejection |= {"random": {"auprc": 0.5}, "oracle": {"auprc": 1.0}}
    section = {"rejection": rejection, "ambiguity_spearman": dict(nauprc)}
    ood = {"auroc": nauprc, "rejected": {n: v / 2 for n, v in nauprc.items()}}
    extra = {"shapes_probes": {"auroc": {n: 1 - v for n, v in nauprc.items()}}}
    return {
        "metrics": {metric: {d: section for d in DIRECTIONS} | {"ood": ood, "ood_extra": extra}}
    }


def loop_reject(nauprc: dict[str, float]) -> str:
    """The learned name with the best finite value (the first on a tie), by a loop."""
    best = None
    for name, value in nauprc.items():
        if name in BASELINES or math.isnan(value):
            continue
        if best is None or value > nauprc[best]:
            best = name
    return best


def test_the_reject_score_is_chosen_among_the_learned_scores_only():
    baselines = {"top1_distance": 0.9, "top1_margin": 0.8, "top1_instability": 0.7}
    baselines |= {"top1_mean_distance": 0.85}
    baselines["total_variance"] = 0.95  # reported, but the service cannot ship it
    val = _report(dict.fromkeys(LEARNED, 0.1) | {"posterior_entropy@T1": 0.3} | baselines)
    choices = val_choices(val, "w2")
    for d in DIRECTIONS:
        assert choices[f"{d}/reject"] == "posterior_entropy@T1"
        assert choices[f"{d}/total_variance"] == "total_variance"
        assert choices[f"{d}/posterior_entropy"] == "posterior_entropy@T1"
        assert [choices[f"{d}/{b}"] for b in BASELINES] == list(BASELINES)
    mahalanobis = {"top_mahalanobis": 0.2, "top1_margin": 0.95}
    only_mahalanobis = _report(dict.fromkeys(LEARNED, 0.1) | mahalanobis)
    assert val_choices(only_mahalanobis, "w2")["t2i/reject"] == "top_mahalanobis"


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.one_of(st.just(math.nan), st.floats(-1, 1)),
        min_size=len(LEARNED) + len(BASELINES),
        max_size=len(LEARNED) + len(BASELINES),
    ),
    st.permutations((*LEARNED, *BASELINES)),
)
def test_the_reject_score_is_the_best_learned_one_whatever_the_baselines(values, names):
    nauprc = dict(zip(names, values, strict=True))
    reject = val_choices(_report(nauprc), "w2")["i2t/reject"]
    assert reject not in BASELINES
    expected = loop_reject(nauprc)
    assert reject == (expected if expected is not None else next(n for n in names if n in LEARNED))


def _baseline_stats(reject: list[float], baselines: dict[str, list[float]]) -> dict:
    row = {f"nauprc/{d}/reject": Stat.of(reject) for d in DIRECTIONS}
    row |= {f"nauprc/{d}/{b}": Stat.of(v) for d in DIRECTIONS for b, v in baselines.items()}
    return row


def test_the_baseline_line_judges_the_reject_score_against_the_best_baseline():
    baselines = {"top1_distance": [0.1, 0.2, 0.3], "top1_margin": [0.3, 0.4, 0.5]}
    baselines["top1_instability"] = [0.0, 0.0, 0.0]
    ahead = baseline_line("gcie-w2", "i2t", _baseline_stats([0.6, 0.7, 0.8], baselines))
    assert ahead == (
        "- gcie-w2, i2t: reject score nAUPRC ahead by 0.300 (0.700 vs 0.400, spread 0.100) "
        "against margin, the best training-free baseline: beats it."
    )
    same = baseline_line("vse", "t2i", _baseline_stats([0.35, 0.45, 0.55], baselines))
    assert "no difference (0.450 vs 0.400, spread 0.100) against margin" in same
    assert same.endswith(": does not beat it.")
    behind = baseline_line("vse", "t2i", _baseline_stats([0.0, 0.05, 0.1], baselines))
    assert "behind by 0.350" in behind and behind.endswith(": does not beat it.")
    one_seed = baseline_line("vse", "t2i", _baseline_stats([0.9], {"top1_distance": [0.1]}))
    assert "against top-1 dist." in one_seed and one_seed.endswith(": not judged.")
    assert "not judged" in baseline_line("vse", "i2t", _baseline_stats([0.5, 0.6], {}))


def test_baselines_flow_from_the_reports_to_the_tables_and_one_finding_per_run_and_direction():
    runs = [r for r in RUNS if r.name in ("vse", "gcie-w2")]
    results = {}
    for run in runs:
        seeds = []
        for seed in range(3):
            values = dict.fromkeys(LEARNED, 0.2 + 0.01 * seed) | {"top1_distance": 0.1}
            values |= {"top1_margin": 0.05 * seed, "top1_instability": 0.4 + 0.01 * seed}
            values |= {"top1_mean_distance": 0.3}
            test = _report(values, run.metric)
            choices = val_choices(_report(values, run.metric), run.metric)
            figures = uncertainty_figures(test, run.metric, choices)
            seeds.append(SeedResult(figures, choices, test, {}))
        results[run.name] = seeds
    stats = {name: aggregate(rs) for name, rs in results.items()}
    probes = {"photos": 3, "shapes_probes": 4}
    shift = ood_section(runs, stats, probes, "shapes")
    tables = "\n".join(uncertainty_section(runs, stats, results) + shift)
    header = "| model | log-det | entropy | feat. unc. | MI | post. entropy | novelty "
    header += "| var. sum | top-1 dist. | margin "
    header += "| top-1 instab. | top-1 dist. of means "
    assert header + "| reject score (val-chosen) | its nAUPRC |" in tables
    row = "| 0.100 ± 0.000 | 0.050 ± 0.050 | 0.410 ± 0.010 | 0.300 ± 0.000 | log-det, log-det, "
    assert row in tables
    assert "### 3 real photographs" in shift and "### 4 shapes images" in shift
    photos, shapes = shift.index("### 3 real photographs"), shift.index("### 4 shapes images")
    vse_photos = next(ln for ln in shift[photos:shapes] if ln.startswith("| vse |"))
    # rejected %: nAUPRC / 2 for the reject score and the log-det; no novelty in these reports
    assert vse_photos.endswith("| 10.5 ± 0.5 | 10.5 ± 0.5 | n/a |")
    vse_shapes = next(ln for ln in shift[shapes:] if ln.startswith("| vse |"))
    assert "| 0.790 ± 0.010 |" in vse_shapes and vse_shapes.endswith("| n/a | n/a | n/a |")
    lines = [ln for ln in baseline_findings(runs, stats) if ln.startswith("- ")]
    assert len(lines) == 2 * len(runs) * len(DIRECTIONS)  # the best one, then the means'
    assert lines[0] == (
        "- vse, i2t: reject score nAUPRC behind by 0.200 (0.210 vs 0.410, spread 0.010) "
        "against top-1 instab., the best training-free baseline: does not beat it."
    )
    assert lines[len(runs) * len(DIRECTIONS)] == (
        "- vse, i2t: reject score nAUPRC behind by 0.090 (0.210 vs 0.300, spread 0.010) "
        "against top-1 dist. of means, the baseline that reads no variance: does not beat it."
    )
