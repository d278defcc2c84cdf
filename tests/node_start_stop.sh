#!/bin/bash
# node_start_stop.sh COMMAND...: `COMMAND... node` starts, serves one small
# scenario and exits with status 0 on SIGTERM. COMMAND is the tool, or the
# tool behind a wrapper (tests/valgrind.sh TOOL); the scenario is run by the
# last word of COMMAND (the tool itself). The cheap check that the `node`
# subcommand exits clean: under the sanitize preset LeakSanitizer runs when
# the node exits (a leak makes its status non-zero), under tests/valgrind.sh
# memcheck does. Exits 77 (skipped) when the node does (valgrind missing).
#
# No step sleeps to synchronise: the node's "listening on" line is read from
# a fifo, and its exit is seen as the end of that fifo (node_lib.sh).
set -euo pipefail

[ $# -ge 1 ] || { echo "usage: node_start_stop.sh COMMAND..."; exit 1; }
tool=${!#}
. "$(dirname "$0")/node_lib.sh" # fail, need_tool, start_node, stop_node, cleanup_node
need_tool "$tool"
dir=$(mktemp -d "${TMPDIR:-/tmp}/node_start_stop.XXXXXX")

cleanup() {
  local rc=$?
  set +e
  cleanup_node "$rc"
  exec 3<&-
  rm -rf "$dir"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# 60 s: a node under valgrind takes a few seconds to start.
if ! start_node 60 "$@"; then
  stop_node 5
  if [ "$node_status" -eq 77 ]; then
    echo "$line"
    exit 77
  fi
  fail "the node did not print 'listening on ADDR:PORT' within 60 s (got '$line', status $node_status)"
fi
echo "node b (pid $node_pid): $line"

cat >"$dir/served.scn" <<'EOF'
(scenario node-start-stop)
(devices 1)
(nodes (b 1))
(tnode x (floats 256))
(context here 0)
(context cb b/0)
(from-host here x (fill 2))
(copy x (from here) (to cb))
(kernel cb scale x 3)
(checksum cb x (as sum))
(expect (checksum sum) (sum 1536) (count 256))
EOF
rc=0
timeout 120 "$tool" run "$dir/served.scn" --node "b=127.0.0.1:$port" --step-timeout 60 \
  >"$dir/run.out" 2>&1 3<&- || rc=$?
sed 's/^/  /' "$dir/run.out"
[ "$rc" -eq 0 ] || fail "the scenario exited $rc, not 0"

echo "SIGTERM to the node"
stop_node 60
[ "$node_status" -eq 0 ] || fail "the node exited with status $node_status after SIGTERM, not 0"
echo "PASSED: the node served and exited 0"
