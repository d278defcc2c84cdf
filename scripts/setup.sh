#!/usr/bin/env bash
# Installs the Debian packages multidev needs (when missing), then configures
# and builds it with the default preset: everything, or the targets given as
# arguments. Used by run-main.sh and run-tests.sh. MULTIDEV_EXTRA_PACKAGES
# adds packages (run-tests.sh: chromium, which renders the SVG timeline;
# run-fuzz.sh: clang and libFuzzer). MULTIDEV_SETUP_BUILD=0 installs only
# (run-fuzz.sh builds a tree of its own).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# valgrind: the tests labelled valgrind run the examples and the tool under
# memcheck (tests/valgrind.sh; skipped, with a message, without it).
packages=(cmake g++ make ccache pkgconf openssl libcaf-dev libboost-test-dev libcli11-dev libfmt-dev
          nlohmann-json3-dev libtbb-dev libstarpu-dev valgrind ${MULTIDEV_EXTRA_PACKAGES:-})
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  if [ "$(id -u)" -eq 0 ]; then
    sudo=""
  elif command -v sudo >/dev/null; then
    sudo="sudo"
  else
    echo "setup: missing packages (${missing[*]}) and not root; install them as root" >&2
    exit 1
  fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}"
fi

if [ "${MULTIDEV_SETUP_BUILD:-1}" = 0 ]; then exit 0; fi

cmake --preset default >/dev/null
if [ $# -gt 0 ]; then
  cmake --build --preset default --target "$@"
else
  cmake --build --preset default
fi
