#!/usr/bin/env bash
# Sets up, builds, and runs the whole test suite through CTest, twice: the
# default build, then the same suite built with AddressSanitizer and
# UndefinedBehaviorSanitizer (the `sanitize` preset, in build-sanitize/; about
# 10-15 minutes from scratch on 2 cores). MULTIDEV_SANITIZE=0 skips the second.
# Then the fuzz smoke run: each libFuzzer harness of fuzz/ (the s-expression
# parser, the scenario loader, the actors' protocol) for 40 s
# (scripts/run-fuzz.sh; 2 minutes of fuzzing, plus its build, which compiles
# the whole library with clang once: ccache keeps it); MULTIDEV_FUZZ=0 skips it. Last, the core tests under
# ThreadSanitizer (scripts/run-tsan.sh: the `tsan` preset in build-tsan/,
# about 6 minutes with its build, which builds the core tests' programs
# only; every report with both sides in this
# repository fails it); MULTIDEV_TSAN=0 skips it.
# The packages of the build, of the tests and of the bench are installed
# (scripts/setup.sh, MULTIDEV_SETUP=tests), and Chromium (Debian `chromium`)
# for the test that renders a scenario's SVG timeline to a PNG.
# Disk: the four build trees and ccache's cache take about 18 GB. With less
# than MULTIDEV_LOW_DISK_GB (20) free at the start, ccache is off and each
# tree but the last is removed once its step passed (rebuilt next time).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

free_gb() { df -Pk . | awk 'NR == 2 { print int($4 / 1048576) }'; }
low_disk=0
if [ "$(free_gb)" -lt "${MULTIDEV_LOW_DISK_GB:-20}" ]; then
  low_disk=1
  export CCACHE_DISABLE=1
  echo "run-tests: $(free_gb) GB free, under ${MULTIDEV_LOW_DISK_GB:-20}: ccache off, and each build tree removed once its step passed"
fi
# Removes tree $1 after its step passed, when the disk is short.
done_with() {
  if [ "$low_disk" = 1 ]; then
    echo "run-tests: removing $1/ (its step passed; $(free_gb) GB free before)"
    rm -rf "$1"
  fi
}

# Each step's time, so a slow run shows which step grew.
started=$SECONDS
mark=$SECONDS
timed() {
  echo "run-tests: $1 took $((SECONDS - mark)) s ($((SECONDS - started)) s so far)"
  mark=$SECONDS
}

MULTIDEV_SETUP=tests MULTIDEV_EXTRA_PACKAGES=chromium scripts/setup.sh
timed "setup and the default build"
ctest --preset default
timed "the default suite"
done_with build

if [ "${MULTIDEV_SANITIZE:-1}" != 0 ]; then
  cmake --preset sanitize >/dev/null
  cmake --build --preset sanitize
  timed "the sanitizer build"
  ctest --preset sanitize
  timed "the sanitizer suite"
  done_with build-sanitize
fi

if [ "${MULTIDEV_FUZZ:-1}" != 0 ]; then
  scripts/run-fuzz.sh 40
  timed "the fuzz build and run"
  done_with build-fuzz
fi

if [ "${MULTIDEV_TSAN:-1}" != 0 ]; then
  scripts/run-tsan.sh --core
  timed "the TSan build and core suite"
fi
