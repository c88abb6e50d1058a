#!/usr/bin/env bash
# Install what hetkv needs to build and test: Debian packages (compiler,
# meson, hwloc, oneDNN, libnuma, Boost.Context for the CUDA emulator, jansson for JSON,
# libmicrohttpd for hetkv serve, Open MPI for hetkv batch across processes, golang-1.19-src
# for the text hetkv eval reads by default: Newton's Opticks) and the
# Python packages of the test suite.
# Idempotent; skips apt when everything is already there.
set -euo pipefail
cd "$(dirname "$0")/../.."

pkgs=(gcc g++ make meson ninja-build pkg-config libhwloc-dev libdnnl-dev libnuma-dev
      libboost-context-dev libjansson-dev libmicrohttpd-dev libopenmpi-dev openmpi-bin
      python3 python3-pip python3-matplotlib valgrind golang-1.19-src)
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    echo "setup: installing ${missing[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if [ -f tests/requirements.txt ]; then
    if ! python3 -c "import sys; sys.exit(0)" 2>/dev/null; then
        echo "setup: python3 is missing" >&2; exit 1
    fi
    python3 -m pip install -q --disable-pip-version-check -r tests/requirements.txt 2>/dev/null ||
        python3 -m pip install -q --disable-pip-version-check --break-system-packages -r tests/requirements.txt
fi
