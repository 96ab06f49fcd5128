#!/usr/bin/env bash
# Creates .venv (if missing) and installs what one purpose needs:
#   bootstrap.sh demo   probsearch with the CPU extra, and Debian's openclipart-svg with
#                       librsvg2-bin (the demo's drawings and their renderer);
#   bootstrap.sh        (all) that, plus the dev tools, Ray (tests/indexer/test_ray_engine.py runs
#                       `reindex --engine ray` on a local Ray), Milvus Lite (the Milvus backend's
#                       tests), redis-server (the tests start Redis servers of their own) and
#                       chromium with chromium-driver (the browser tests).
# pip runs only when pyproject.toml changed since the last install for that purpose (the
# package is installed editable, so code changes need none): a second run installs nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

mode=${1:-all}
case "$mode" in
    demo) extras='.[cpu]' ;;
    all) extras='.[cpu,dev,ray,milvus-lite]' ;;
    *) echo "usage: bootstrap.sh [demo|all]" >&2; exit 2 ;;
esac

python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$python" -m venv .venv
fi
wanted=$(sha256sum pyproject.toml | cut -d' ' -f1)
installed() { [ "$(cat ".venv/.installed-$1" 2>/dev/null)" = "$wanted" ]; }
if installed "$mode" || { [ "$mode" = demo ] && installed all; }; then
    echo "python packages up to date for $mode (pyproject.toml unchanged)" >&2
else
    .venv/bin/python -m pip install --quiet --upgrade pip
    .venv/bin/python -m pip install --quiet -e "$extras"
    echo "$wanted" > ".venv/.installed-$mode"
fi

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

if [ "$mode" = all ] && ! command -v redis-server >/dev/null 2>&1; then
    echo "redis-server not found: installing Debian's redis-server package" >&2
    apt_install redis-server
fi
if [ "$mode" = all ] && { ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; }; then
    echo "chromium or chromedriver not found: installing Debian's chromium and chromium-driver" >&2
    apt_install chromium chromium-driver
fi
if [ ! -d /usr/share/openclipart/svg ] || ! command -v rsvg-convert >/dev/null 2>&1; then
    echo "the clip-art library or its renderer is missing: installing Debian's openclipart-svg and librsvg2-bin" >&2
    apt_install openclipart-svg librsvg2-bin
fi
