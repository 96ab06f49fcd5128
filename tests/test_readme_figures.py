"""Every measured figure quoted in README.md (and in docs/benchmarks.md, its summary of the
measurements) is copied from a results file: some file under benchmarks/results/ or a
docs/results*.md holds it verbatim. A figure typed by hand, rounded, or left behind by an
older run fails here.

What counts as a figure (one rule, kept simple):
- only prose: fenced code blocks, inline `code` spans, link targets `](...)` and `<...>`
  autolinks are dropped first (ports, paths, versions in commands are not figures);
- a number with a decimal point (`0.741`, `49.2 ± 2.0`, `1.46x`), or a whole number directly
  followed by a unit: %, s, ms, min, QPS, x, MiB, GiB (`91.7%`, `5 min`);
- a number glued to a letter, a dot or a hyphen (`MiniLM-L6`, the `2.13` of `2.13.0`) is not
  one, nor is a bare whole number (years, counts such as "7,327 drawings"). A two-part version
  in prose (Python 3.12) would count: write it as code.
A figure with its spread (`49.2 ± 2.0`) must appear with that spread. The check looks for the
number's text, not its unit: the results tables put units in their headers.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CHECKED = [REPO / "README.md", REPO / "docs" / "benchmarks.md"]

_NUMBER = r"(?<![\w.\-])\d+(?:\.\d+)?(?![\w]|\.\d)"
_FIGURE = re.compile(
    rf"(?P<figure>{_NUMBER}(?:\s*±\s*\d+(?:\.\d+)?)?)"
    r"(?P<unit>\s*(?:%|ms\b|s\b|min\b|QPS\b|x\b|MiB\b|GiB\b))?"
)


def prose(markdown: str) -> str:
    """The markdown without code blocks, code spans, link targets and autolinks."""
    text = re.sub(r"^```.*?^```", "", markdown, flags=re.S | re.M)
    text = re.sub(r"`[^`\n]*`", "", text)
    text = re.sub(r"\]\([^)]*\)", "]", text)
    return re.sub(r"<[a-z]+://[^>]*>", "", text)


def quoted_figures(markdown: str) -> list[str]:
    """The figures of the docstring's rule, in order of appearance."""
    found = []
    for match in _FIGURE.finditer(prose(markdown)):
        figure = match["figure"]
        if "." in figure or match["unit"]:
            found.append(re.sub(r"\s+", " ", figure))
    return found


def results_text() -> str:
    """Every results file, concatenated: benchmarks/results/** and docs/results*.md."""
    files = [p for p in (REPO / "benchmarks" / "results").rglob("*") if p.is_file()]
    files += sorted((REPO / "docs").glob("results*.md"))
    texts = []
    for path in files:
        try:
            texts.append(path.read_text(encoding="utf-8"))
        except UnicodeDecodeError:  # a plot or other binary file
            continue
    return re.sub(r"[ \t]+", " ", "\n".join(texts))


def unsourced(markdown: str, sources: str) -> list[str]:
    """The figures of `markdown` that no results file holds as a whole number."""
    missing = []
    for figure in quoted_figures(markdown):
        pattern = re.escape(figure).replace(r"\ ", r"\s+")
        if not re.search(rf"(?<![\d.]){pattern}(?![\d]|\.\d)", sources):
            missing.append(figure)
    return missing


def test_every_quoted_figure_comes_from_a_results_file() -> None:
    sources = results_text()
    for path in CHECKED:
        markdown = path.read_text(encoding="utf-8")
        assert quoted_figures(markdown), f"{path.name}: no figure found; is the rule broken?"
        missing = unsourced(markdown, sources)
        assert missing == [], (
            f"{path.relative_to(REPO)} quotes figures no file under benchmarks/results/ or "
            f"docs/results*.md holds: {missing}"
        )


def test_a_made_up_figure_is_reported() -> None:
    """The check can fail: an invented figure, a rounded one and one with the wrong spread are
    each reported, while a real one, code, a port and a version are not."""
    sources = "| total | **360.3** |\n| gcie-spread | 49.2 ± 2.0 |\n| photographs | 91.7 |\n"
    readme = (
        "# probsearch\n\n```bash\nbash scripts/demo.sh --port 8000 --threads 2.5\n```\n\n"
        "The first build took 360.3 s; it rejects 91.7% of photographs and 73.2% of noise.\n"
        "Its t2i P@1 is 49.2 ± 2.0, or 49.2 ± 2.1, or 49 %. Serves on <http://127.0.0.1:8000/>\n"
        "with torch `2.13.0` and MiniLM-L6, Python 3.11.7 since 2026, over 7,327 drawings.\n"
    )
    assert quoted_figures(readme) == ["360.3", "91.7", "73.2", "49.2 ± 2.0", "49.2 ± 2.1", "49"]
    assert unsourced(readme, sources) == ["73.2", "49.2 ± 2.1", "49"]
