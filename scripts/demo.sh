#!/usr/bin/env bash
# Sets up the environment (scripts/bootstrap.sh) and runs the demo: shapes data, a trained model,
# calibrated image and caption indexes, and the service with its search page on
# http://127.0.0.1:8000.
# Artifacts are cached in .cache/demo, so later runs serve within seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
exec .venv/bin/probsearch demo "$@"
