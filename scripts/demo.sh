#!/usr/bin/env bash
# Sets up what the demo needs (scripts/bootstrap.sh demo: no test tools) and runs the demo:
# clip-art drawings, pretrained encoders with trained heads, calibrated image and caption
# indexes, and the service with its search page on http://127.0.0.1:8000.
# Artifacts are cached in .cache/demo, so later runs serve within seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh demo
exec .venv/bin/probsearch demo "$@"
