#!/usr/bin/env bash
# What one dependency hop executes: instructions and locked instructions
# (lock-prefixed, or xchg with memory), counted by callgrind, for multidev's
# chain of bench case 2 (tools/profile/hop_costs.cpp: the runners running
# it, and the host scheduling it, apart) and oneTBB's two-node ping-pong
# (tools/profile/tbb_hop_costs.cpp). Each figure is what a run of 6,000
# hops (3 times) executed beyond one of 2,000 (3 times), per hop, so that
# start-up and shutdown cancel out. Counts, not times: they do not depend on
# where the guest's vCPUs are placed. Valgrind runs one thread at a time, so
# the runners' spinning varies the instructions a little from run to run;
# the locked ones hardly.
#
#   scripts/count-hop-costs.sh [--top K] [BUILD_DIR]    (default build/)
#
# Then times a locked instruction here (tools/profile/locked_cost.cpp), to
# turn the counts into time. Needs valgrind and objdump (scripts/setup.sh
# installs valgrind; binutils comes with g++). Builds the programs (targets
# hop_costs, locked_cost and, with oneTBB, tbb_hop_costs) in BUILD_DIR
# first.
set -euo pipefail
top=0
if [[ "${1:-}" == "--top" ]]; then
  top=$2
  shift 2
fi
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(realpath "${1:-$root/build}")
for tool in valgrind objdump; do
  command -v "$tool" >/dev/null || { echo "count-hop-costs: $tool not found" >&2; exit 1; }
done
targets=(hop_costs locked_cost)
# tbb_hop_costs exists where CMake found oneTBB.
if [[ "$(cmake --build "$build" --target help 2>/dev/null)" == *" tbb_hop_costs"* ]]; then
  targets+=(tbb_hop_costs)
fi
cmake --build "$build" -j2 --target "${targets[@]}" >/dev/null
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
small=2000 large=6000 reps=3
per=$(( (large - small) * reps ))

# count LABEL TOGGLE PROGRAM ARGS...: HOPS and TOTAL in ARGS become the hops.
count() {
  local label=$1 toggle=$2 prog=$3
  shift 3
  local n
  for n in $small $large; do
    local args=()
    local a
    for a in "$@"; do
      case $a in
        HOPS) args+=("$n") ;;
        TOTAL) args+=("$((n * reps))") ;;
        *) args+=("$a") ;;
      esac
    done
    local collect=(--collect-atstart=yes)
    [[ -n "$toggle" ]] && collect=(--collect-atstart=no "--toggle-collect=$toggle")
    valgrind --tool=callgrind --dump-instr=yes "${collect[@]}" \
      --callgrind-out-file="$work/$n.out" "$prog" "${args[@]}" >/dev/null 2>"$work/valgrind.log" || {
        cat "$work/valgrind.log" >&2
        exit 1
      }
  done
  printf '%-44s ' "$label"
  python3 "$root/scripts/locked-ops.py" --per "$per" --top "$top" \
    "$work/$small.out" "$work/$large.out"
}

echo "per hop (callgrind; $small and $large hops, $reps times each):"
count "multidev, the runners running the chain" 'multidev::detail::device_runner::run()' \
  "$build/bin/hop_costs" HOPS "$reps"
count "multidev, the host scheduling it" '*schedule_chain*' \
  "$build/bin/hop_costs" HOPS "$reps"
if [[ " ${targets[*]} " == *" tbb_hop_costs "* ]]; then
  count "oneTBB two-node ping-pong, every thread" "" "$build/bin/tbb_hop_costs" TOTAL
else
  echo "oneTBB two-node ping-pong: skipped: oneTBB not installed"
fi
"$build/bin/locked_cost"
