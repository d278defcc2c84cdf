#!/usr/bin/env bash
# Losing one node over TLS fails only that node's work: a run attached over
# TLS to nodes a, b and c (all spawned by the run) kills b (kill -9), and a
# and c go on serving, work between them included; then c is cut off
# (SIGSTOP), and a still serves. Then examples/scenarios/two_nodes.scn
# (kill -9 of b, then a cut off) over TLS. Before the fix, CAF 0.17's OpenSSL
# module closed every TLS connection of the run once one peer's ended
# (actors/remote/tls_middleman.hpp). Usage: tls_node_loss.sh MULTIDEV_TOOL SOURCE_DIR
set -euo pipefail
tool=$1
src=$2
. "$(dirname "$0")/node_lib.sh" # need_openssl
need_openssl
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if ! "$src/scripts/make-test-certs.sh" "$work/certs" >/dev/null 2>&1; then
  echo "SKIPPED: openssl could not make the test certificates (scripts/make-test-certs.sh)"
  exit 77
fi
c=$work/certs
tls=(--tls-cert "$c/node.pem" --tls-key "$c/node.key" --tls-ca "$c/ca.pem")

cat >"$work/loss.scn" <<'SCN'
(scenario tls-node-loss)
(devices 1)
(nodes (a 1) (b 1) (c 1))
(tnode x (floats 256))
(context here 0) (context ca a/0) (context cb b/0) (context cc c/0)
(expect (kernel ca spin_ns 0) ok)
(expect (kernel cc spin_ns 0) ok)
; b busy, with work queued behind, and this process waiting on it
(kernel cb spin_ns 20000000000)
(kernel cb spin_ns 0 (as b_pending))
(wait here b_pending)
(kernel here spin_ns 0 (as waits_for_b))
(kill-node b)
(expect (sync waits_for_b) (fails (matches "b/multidev_cpu")))
(expect (kernel cb spin_ns 0) (fails (matches "b/multidev_cpu")))
; a and c are untouched: work on each, a wait of a on c, bytes from a to c
(expect (kernel ca spin_ns 0) ok)
(expect (kernel cc spin_ns 0) ok)
(from-host ca x (fill 2))
(copy x (from ca) (to cc))
(kernel cc scale x 3 (as tripled))
(wait ca tripled)
(checksum cc x (as sum))
(kernel ca spin_ns 0 (as a_after_c))
(expect (sync a_after_c) ok)
(expect (checksum sum) (sum 1536) (count 256))
; c cut off (SIGSTOP): the heartbeat drops it; a is untouched
(cut-node c)
(expect (kernel cc spin_ns 0) (fails (matches "c/multidev_cpu")))
(expect (kernel ca spin_ns 0) ok)
SCN

run() { # NAME FILE: runs FILE over TLS with spawned nodes (bounded); must pass
  local name=$1 status=0
  timeout 120 "$tool" run "$2" --spawn-nodes --quiet "${tls[@]}" >"$work/out" 2>&1 || status=$?
  if [[ $status != 0 ]]; then
    echo "FAILED: $name: exit $status"
    cat "$work/out"
    exit 1
  fi
  echo "ok: $name"
}
run "kill -9 of b, then SIGSTOP of c, over TLS: the others serve" "$work/loss.scn"
run "two_nodes.scn over TLS" "$src/examples/scenarios/two_nodes.scn"
echo "PASSED"
