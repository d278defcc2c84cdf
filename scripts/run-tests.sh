#!/usr/bin/env bash
# Sets up, builds, and runs the whole test suite through CTest, twice: the
# default build, then the same suite built with AddressSanitizer and
# UndefinedBehaviorSanitizer (the `sanitize` preset, in build-sanitize/; about
# 10-15 minutes from scratch on 2 cores). MULTIDEV_SANITIZE=0 skips the second.
# Then the fuzz smoke run: each libFuzzer harness of fuzz/ (the s-expression
# parser, the scenario loader, the actors' protocol) for 60 s
# (scripts/run-fuzz.sh; 3 minutes of fuzzing, plus its build, which compiles
# the whole library with clang once: ccache keeps it); MULTIDEV_FUZZ=0 skips it. Last, the core tests under
# ThreadSanitizer (scripts/run-tsan.sh: the `tsan` preset in build-tsan/,
# about 10 minutes with its build; every report with both sides in this
# repository fails it); MULTIDEV_TSAN=0 skips it.
# The packages of the build, of the tests and of the bench are installed
# (scripts/setup.sh, MULTIDEV_SETUP=tests), and Chromium (Debian `chromium`)
# for the test that renders a scenario's SVG timeline to a PNG.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
MULTIDEV_SETUP=tests MULTIDEV_EXTRA_PACKAGES=chromium scripts/setup.sh
ctest --preset default

if [ "${MULTIDEV_SANITIZE:-1}" != 0 ]; then
  cmake --preset sanitize >/dev/null
  cmake --build --preset sanitize
  ctest --preset sanitize
fi

if [ "${MULTIDEV_FUZZ:-1}" != 0 ]; then
  scripts/run-fuzz.sh 60
fi

if [ "${MULTIDEV_TSAN:-1}" != 0 ]; then
  scripts/run-tsan.sh -R "$(scripts/run-tsan.sh --core-regex)"
fi
