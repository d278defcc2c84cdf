#!/usr/bin/env bash
# Builds the suite with ThreadSanitizer (the `tsan` preset, in build-tsan/),
# runs it through CTest and classifies the reports.
#
#   scripts/run-tsan.sh [ctest args...]     e.g. -L white_box, -R test_backend
#
# TSan writes its reports to build-tsan/tsan-logs/tsan.<pid> (TSAN_OPTIONS in
# the test preset; exitcode=0, so a report alone does not fail a test), then
# scripts/tsan-classify.py sorts them: a report with a side in CAF (Debian's,
# not instrumented) is noise, one whose every side is this repository's code
# is kept and printed. The exit status is non-zero when ctest failed or a
# report was kept. The core set (device core, queue, events, transfers,
# recorded rounds replayed on the devices (bulk_push),
# the reuse of host copies' extras, async driver, fake CUDA; about a minute
# on 2 cores once built, and the build
# about 5 minutes with --core, which builds only the core tests' programs;
# scripts/run-tests.sh runs it so):
#
#   scripts/run-tsan.sh --core       # build the core set only, run it
#   scripts/run-tsan.sh -R "$(scripts/run-tsan.sh --core-regex)"  # same tests, whole build
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

core='^(test_backend|test_rounds|test_rounds_fake|test_rounds_on_nodes|test_rounds_nodes|test_deadlock|test_hand_over|test_hand_over_help|test_hot_path|test_ordering|test_errors|test_errors_fake|test_transfers|test_transfers_fake|test_transfers_fake_cuda|test_async_driver|test_cuda|test_shutdown)$'
if [ "${1:-}" = --core-regex ]; then
  echo "$core"
  exit 0
fi
targets=()
if [ "${1:-}" = --core ]; then
  # The programs the core set runs: tests/CMakeLists.txt's
  # multidev_core_tests (test_rounds_nodes starts the tool's nodes). Other
  # ctest arguments may follow, but no -R of its own.
  shift
  targets=(--target multidev_core_tests)
  set -- -R "$core" "$@"
fi

cmake --preset tsan >/dev/null || exit 1
cmake --build --preset tsan -j2 "${targets[@]}" -- --quiet >/dev/null \
  || cmake --build --preset tsan -j1 "${targets[@]}" || exit 1

logs=build-tsan/tsan-logs
rm -rf "$logs"
mkdir -p "$logs"
ctest --preset tsan "$@"
ctest_status=$?
python3 scripts/tsan-classify.py "$logs"
classify_status=$?
echo "run-tsan: ctest exit status $ctest_status, classifier exit status $classify_status"
[ "$ctest_status" = 0 ] && [ "$classify_status" = 0 ]
