#!/usr/bin/env bash
# Creates .venv (if missing) and installs probsearch with the CPU extra and the dev tools, plus
# Debian's redis-server when the machine has none (the tests start Redis servers of their own).
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$python" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e '.[cpu,dev]'

if ! command -v redis-server >/dev/null 2>&1; then
    echo "redis-server not found: installing Debian's redis-server package" >&2
    sudo_cmd=""
    [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
    $sudo_cmd apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq redis-server >/dev/null
fi
