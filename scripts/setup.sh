#!/usr/bin/env bash
# Installs the Debian packages multidev needs (when missing), then configures
# and builds it with the default preset: everything, or the targets given as
# arguments. MULTIDEV_SETUP says for what:
#   main   what building and running the tool and the library need
#          (run-main.sh); configures without the test suite
#          (-DMULTIDEV_BUILD_TESTS=OFF), which needs Boost.Test;
#   tests  (default) that, plus what the tests and the bench use; configures
#          with the test suite (run-tests.sh, run-fuzz.sh, run_gpu_checks.sh).
# MULTIDEV_EXTRA_PACKAGES adds packages (run-tests.sh: chromium, which
# renders the SVG timeline; run-fuzz.sh: clang and libFuzzer).
# MULTIDEV_SETUP_BUILD=0 installs only (run-fuzz.sh builds a tree of its own).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

setup=${MULTIDEV_SETUP:-tests}
# The build and the tool: compiler and build tools, CAF, fmt, CLI11, JSON.
main_packages=(cmake g++ make ccache libcaf-dev libcli11-dev libfmt-dev nlohmann-json3-dev)
# The tests and the bench: Boost.Test; openssl (the TLS test's certificates);
# pkgconf (the package test's pkg-config build; the bench finds StarPU
# through it); valgrind (the tests labelled valgrind run the examples and the
# tool under memcheck: tests/valgrind.sh, skipped with a message without it);
# doxygen (the API reference, target doc, and its test docs_api_reference);
# oneTBB and StarPU (the bench's peers); lld (links the test programs in a
# third of GNU ld's time; CMake falls back to GNU ld without it).
test_packages=(lld libboost-test-dev openssl pkgconf valgrind doxygen libtbb-dev libstarpu-dev)
case "$setup" in
  main)
    packages=("${main_packages[@]}")
    build_tests=OFF
    ;;
  tests)
    packages=("${main_packages[@]}" "${test_packages[@]}")
    build_tests=ON
    ;;
  *)
    echo "setup: MULTIDEV_SETUP is main or tests, got '$setup'" >&2
    exit 2
    ;;
esac
# shellcheck disable=SC2206 # a space-separated list
packages+=(${MULTIDEV_EXTRA_PACKAGES:-})
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

cmake --preset default -DMULTIDEV_BUILD_TESTS=$build_tests >/dev/null
if [ $# -gt 0 ]; then
  cmake --build --preset default --target "$@"
else
  cmake --build --preset default
fi
