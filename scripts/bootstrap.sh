#!/usr/bin/env bash
# Creates .venv (if missing) and installs probsearch with the CPU extra, the dev tools, Ray
# (tests/indexer/test_ray_engine.py runs `reindex --engine ray` on a local Ray) and Milvus Lite
# (the Milvus shortlist backend's tests run against a local Milvus Lite file), plus
# the Debian packages the tests need when the machine lacks them: redis-server (the tests start
# Redis servers of their own), chromium with chromium-driver (the search page's browser test),
# and openclipart-svg with librsvg2-bin (`probsearch data clipart`: the drawings and their renderer).
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$python" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e '.[cpu,dev,ray,milvus-lite]'

apt_updated=""
apt_install() {
    if ! command -v apt-get >/dev/null 2>&1; then
        echo "no apt-get here: install these packages by hand: $*" >&2
        return 0
    fi
    local sudo_cmd=""
    [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
    if [ -z "$apt_updated" ]; then
        $sudo_cmd apt-get update -qq
        apt_updated=1
    fi
    DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "$@" >/dev/null
}

if ! command -v redis-server >/dev/null 2>&1; then
    echo "redis-server not found: installing Debian's redis-server package" >&2
    apt_install redis-server
fi
if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
    echo "chromium or chromedriver not found: installing Debian's chromium and chromium-driver" >&2
    apt_install chromium chromium-driver
fi
if [ ! -d /usr/share/openclipart/svg ] || ! command -v rsvg-convert >/dev/null 2>&1; then
    echo "the clip-art library or its renderer is missing: installing Debian's openclipart-svg and librsvg2-bin" >&2
    apt_install openclipart-svg librsvg2-bin
fi
