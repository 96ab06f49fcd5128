#!/usr/bin/env bash
# Sets up the environment (scripts/bootstrap.sh) and runs the whole test suite.
# Two pytest workers (pytest-xdist), each taking a whole test file at a time so that a file's
# module fixtures are built once: on the 2-core box the suite took 602 s that way against 961 s
# in one process (2026-11-27, one run each, the same commit). PROBSEARCH_TEST_WORKERS=0 runs it
# in one process (a debugger, or a machine with one core).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
workers=${PROBSEARCH_TEST_WORKERS:-2}
exec .venv/bin/python -m pytest --numprocesses "$workers" --dist loadfile "$@"
