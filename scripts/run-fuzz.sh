#!/usr/bin/env bash
# Fuzzes the s-expression parser, the scenario loader and the device and node
# actors' protocol with libFuzzer:
#
#   scripts/run-fuzz.sh [SECONDS]      # each harness for SECONDS (default 60)
#
# Installs clang 16 and libFuzzer when missing (scripts/setup.sh; clang 16: the
# library's aggregates are built with parentheses, P0960, which clang 14
# lacks, and fuzz_protocol compiles the whole library), builds the
# harnesses of fuzz/ (a CMake project of its own, clang, ASan+UBSan) into
# build-fuzz/, then runs fuzz_sexp, fuzz_scenario and fuzz_protocol one after
# the other, each with -max_total_time=SECONDS, -rss_limit_mb=2048 and
# -timeout=10 (per input), with its dictionary (fuzz_protocol with
# -detect_leaks=0: its actor system lives for the whole run). Each runs on
# build-fuzz/corpus/NAME: a scratch copy of the seeds in fuzz/corpus/NAME
# (never written to), which keeps what earlier runs found (rm -rf
# build-fuzz/corpus to start over from the seeds).
# Exits 1 naming each harness that found a crash, a sanitizer report, an
# escaped exception, a hang or runaway memory, and where libFuzzer wrote the
# input (build-fuzz/artifacts/NAME/); its log is build-fuzz/logs/NAME.log.
# Reproduce with: build-fuzz/NAME build-fuzz/artifacts/NAME/crash-...
# MULTIDEV_FUZZ_JOBS: build jobs (2). MULTIDEV_FUZZ_ONLY=NAME: one harness.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

seconds=${1:-60}
if ! [[ "$seconds" =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: scripts/run-fuzz.sh [SECONDS]  (default 60)" >&2
  exit 2
fi

MULTIDEV_EXTRA_PACKAGES="clang-16 libclang-rt-16-dev ${MULTIDEV_EXTRA_PACKAGES:-}" \
  MULTIDEV_SETUP_BUILD=0 scripts/setup.sh

build=build-fuzz
mkdir -p "$build/logs"
echo "fuzz: building the harnesses in $build/"
if ! cmake -S fuzz -B "$build" -DCMAKE_CXX_COMPILER="${MULTIDEV_FUZZ_CXX:-clang++-16}" \
       >"$build/logs/configure.log" 2>&1; then
  cat "$build/logs/configure.log" >&2
  exit 1
fi
if ! cmake --build "$build" -j "${MULTIDEV_FUZZ_JOBS:-2}" >"$build/logs/build.log" 2>&1; then
  cat "$build/logs/build.log" >&2
  exit 1
fi

export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1}"

failed=()
for name in sexp scenario protocol; do
  if [ -n "${MULTIDEV_FUZZ_ONLY:-}" ] && [ "$MULTIDEV_FUZZ_ONLY" != "$name" ]; then
    continue
  fi
  harness="$build/fuzz_$name"
  corpus="$build/corpus/$name"
  artifacts="$build/artifacts/$name"
  log="$build/logs/$name.log"
  mkdir -p "$corpus"
  cp -R fuzz/corpus/"$name"/. "$corpus"/
  rm -rf "$artifacts"
  mkdir -p "$artifacts"
  echo "fuzz: fuzz_$name for ${seconds} s on $corpus (seeds: fuzz/corpus/$name)"
  rc=0
  extra=()
  # fuzz_protocol keeps an actor system (CAF's threads and singletons) for
  # the whole run: not leaks of an input.
  [ "$name" = protocol ] && extra+=(-detect_leaks=0)
  "$harness" "$corpus" -dict="fuzz/$name.dict" -max_total_time="$seconds" \
    -rss_limit_mb=2048 -timeout=10 -artifact_prefix="$artifacts/" -print_final_stats=1 \
    "${extra[@]}" >"$log" 2>&1 || rc=$?
  # The last status line: runs, coverage, features, corpus, exec/s.
  status=$(grep -a -E '^#[0-9]+' "$log" | tail -n 1 || true)
  echo "fuzz: fuzz_$name: ${status:-no status line}"
  if [ "$rc" -ne 0 ]; then
    failed+=("fuzz_$name")
    echo "fuzz: fuzz_$name FAILED (exit status $rc); the end of $log:" >&2
    tail -n 60 "$log" >&2
    found=$(find "$artifacts" -type f | sort)
    if [ -n "$found" ]; then
      echo "fuzz: fuzz_$name wrote the input that shows it to:" >&2
      sed 's/^/  /' <<<"$found" >&2
      echo "fuzz: reproduce with: $harness $(head -n 1 <<<"$found")" >&2
    else
      echo "fuzz: fuzz_$name wrote no input (see $log)" >&2
    fi
  fi
done

if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: FAILED: ${failed[*]}" >&2
  exit 1
fi
echo "fuzz: no findings"
