"""What the served demo answers to the captions a newcomer typed in issue 42 (nonsense, a
colour and shape the data lacks, another language, typos, a scene no picture holds), next to
captions it should answer: each sent to a real server (`probsearch serve`) as POST
/search/text and reported with its verdict, the reject score that decided, the unknown words
it lists, the caption it suggests instead (did_you_mean) and the id of its first result; each
suggestion is then sent as a query of its own.

    python benchmarks/newcomer_queries.py                          # the clip-art demo
    python benchmarks/newcomer_queries.py --plan shapes --demo-dir .cache/demo-shapes
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.service_bench_setup import demo_artifacts, provenance, server

ROOT = Path(__file__).resolve().parents[1]
ISSUE_QUERIES = ("asdf qwerty", "a pink hexagon", "ein roter Kreis", "redd circel",
                 "two blue squares")  # fmt: skip
# Typos beside issue 42's "redd circel": the service should suggest the caption meant.
TYPOS = {"clipart": ("a pengiun",), "shapes": ("a smal blue sqare",)}
CONTROLS = {
    "clipart": ("a drawing of a penguin", "a red apple", "a car"),
    "shapes": ("a red circle", "a small blue square", "two green stars"),
}


def answered(url: str, texts: tuple[str, ...]) -> list[dict]:
    with httpx.Client(base_url=url, timeout=60) as client:
        return [client.post("/search/text", json={"text": t, "k": 1}).json() for t in texts]


def row(text: str, answer: dict) -> str:
    query = answer["query"]
    score = query["reject_score"]
    value = "n/a" if score["value"] is None else f"{score['value']:.3g}"
    limit = "none" if score["threshold"] is None else f"{score['threshold']:.3g}"
    verdict = "REJECTED" if query["rejected"] else "answered"
    unknown = ", ".join(query.get("unknown_words", [])) or "-"
    suggested = query.get("did_you_mean") or "-"
    first = answer["results"][0] if answer["results"] else None
    top = "-" if first is None else first["id"]
    decided = f"{score['name']} {value} (limit {limit})"
    return f"| {text} | {verdict} | {decided} | {unknown} | {suggested} | {top} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plan", choices=sorted(CONTROLS), default="clipart")
    parser.add_argument("--demo-dir", type=Path, default=ROOT / ".cache" / "demo")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    out = args.out or ROOT / "benchmarks" / "results" / f"newcomer_queries_{args.plan}.md"
    command = " ".join([".venv/bin/python benchmarks/newcomer_queries.py", *sys.argv[1:]])
    artifacts = demo_artifacts(args.demo_dir, quick=False, plan_name=args.plan)
    texts = ISSUE_QUERIES + TYPOS[args.plan] + CONTROLS[args.plan]
    with tempfile.TemporaryDirectory() as tmp:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PROBSEARCH_")}
        env["PYTHONPATH"] = str(ROOT)
        with server(env, artifacts.model, artifacts.index_root, Path(tmp) / "server.log") as (
            url,
            _,
        ):
            answers = answered(url, texts)
            suggestions = tuple(dict.fromkeys(
                a["query"]["did_you_mean"] for a in answers if a["query"].get("did_you_mean")
            ))  # fmt: skip
            answers += answered(url, suggestions)
            model = httpx.get(f"{url}/v1/config", timeout=10).json().get("model", "?")
    labels = texts + tuple(f"{text} (suggested)" for text in suggestions)
    lines = [
        f"# A newcomer's captions against the served {args.plan} demo",
        "",
        f"{provenance(command)} Model: {model}.",
        "",
        "Each caption is one POST /search/text with k=1 and the service's defaults. The first "
        f"{len(ISSUE_QUERIES)} are issue 42's, then typos; the rest should be answered, and "
        "last come the captions the service suggested instead (did you mean). Decided by: the "
        "reject score the answer names, its value and limit (unknown_words: the share of the "
        "caption's content words the model never met in training, refused above 0.5).",
        "",
        "| caption | verdict | decided by | unknown words | did you mean | first result |",
        "| --- | --- | --- | --- | --- | --- |",
        *(row(text, answer) for text, answer in zip(labels, answers, strict=True)),
        "",
    ]
    out.write_text("\n".join(lines))
    print(out.read_text())


if __name__ == "__main__":
    main()
