#!/usr/bin/env bash
# TLS between nodes (libcaf_openssl): a run that starts its node with the
# TLS files passes, and so does one with two TLS nodes that copy and wait
# between them; against a TLS node, a client without TLS and a client
# whose certificate another CA signed are refused with an error naming the
# node (exit 2, no hang), and the node goes on serving a client with a good
# certificate. Usage: tls_nodes.sh MULTIDEV_TOOL SOURCE_DIR
set -euo pipefail
tool=$1
src=$2
. "$(dirname "$0")/node_lib.sh" # need_openssl
need_openssl
work=$(mktemp -d)
node_pid=
cleanup() {
  if [[ -n $node_pid ]] && kill -0 "$node_pid" 2>/dev/null; then
    kill -TERM "$node_pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$node_pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$node_pid" 2>/dev/null || true
  fi
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
"$src/scripts/make-test-certs.sh" "$work/certs" >/dev/null
c=$work/certs
good=(--tls-cert "$c/node.pem" --tls-key "$c/node.key" --tls-ca "$c/ca.pem")
rogue=(--tls-cert "$c/rogue.pem" --tls-key "$c/rogue.key" --tls-ca "$c/ca.pem")
cat >"$work/tls.scn" <<'SCN'
(scenario tls)
(devices 1)
(nodes (b 1))
(tnode x (floats 256))
(context here 0) (context onb b/0)
(from-host here x (fill 2))
(copy x (from here) (to onb))
(kernel onb scale x 3)
(checksum onb x (as sum))
(expect (checksum sum) (sum 1536) (count 256))
SCN

expect_status() { # WANT NAME CMD...: runs CMD (bounded), checks its exit status
  local want=$1 name=$2 status=0
  shift 2
  timeout 60 "$@" >"$work/out" 2>&1 || status=$?
  if [[ $status != "$want" ]]; then
    echo "FAILED: $name: exit $status, expected $want"; cat "$work/out"; exit 1
  fi
  echo "ok: $name (exit $status)"
}

# 1. One command: the run starts a TLS node with its own files.
expect_status 0 "run --spawn-nodes over TLS" "$tool" run "$work/tls.scn" --spawn-nodes "${good[@]}"

# 1b. Two TLS nodes: node b connects to node a itself (over TLS) for a copy
# a -> b and a wait of b on a (docs/nodes.md, "Direct paths between nodes").
cat >"$work/two.scn" <<'SCN'
(scenario tls-two-nodes)
(devices 1)
(nodes (a 1) (b 1))
(tnode x (floats 256))
(context here 0) (context ona a/0) (context onb b/0)
(from-host here x (fill 2))
(copy x (from here) (to ona))
(kernel ona scale x 3 (as tripled))
(copy x (from ona) (to onb))
(kernel onb scale x 2)
(wait onb tripled)
(checksum onb x (as sum))
(expect (checksum sum) (sum 3072) (count 256))
SCN
expect_status 0 "two TLS nodes, a copy and a wait between them" \
  "$tool" run "$work/two.scn" --spawn-nodes "${good[@]}"

# 2. A TLS node started by hand.
"$tool" node --name b "${good[@]}" >"$work/node.out" 2>"$work/node.err" &
node_pid=$!
for _ in $(seq 300); do
  grep -q "listening on" "$work/node.out" 2>/dev/null && break
  kill -0 "$node_pid" 2>/dev/null || { echo "FAILED: the TLS node exited"; cat "$work/node.err"; exit 1; }
  sleep 0.1
done
port=$(sed -n 's/^listening on .*:\([0-9]*\)$/\1/p' "$work/node.out")
[[ -n $port ]] || { echo "FAILED: the TLS node printed no port"; exit 1; }

expect_status 2 "a client without TLS is refused" "$tool" run "$work/tls.scn" --node "b=127.0.0.1:$port"
grep -q "node 'b'.*does the node use TLS" "$work/out" || { echo "FAILED: no hint"; cat "$work/out"; exit 1; }
expect_status 2 "a certificate of another CA is refused" \
  "$tool" run "$work/tls.scn" --node "b=127.0.0.1:$port" "${rogue[@]}"
grep -q "over TLS" "$work/out" || { echo "FAILED: no TLS in the error"; cat "$work/out"; exit 1; }
expect_status 2 "a missing key file is named" \
  "$tool" run "$work/tls.scn" --node "b=127.0.0.1:$port" --tls-cert "$c/node.pem" \
  --tls-key "$work/nonexistent.key" --tls-ca "$c/ca.pem"
grep -q "nonexistent.key" "$work/out" || { echo "FAILED: the file is not named"; cat "$work/out"; exit 1; }
kill -0 "$node_pid" || { echo "FAILED: the node died"; exit 1; }
expect_status 0 "the node still serves a good client" \
  "$tool" run "$work/tls.scn" --node "b=127.0.0.1:$port" "${good[@]}"
kill -TERM "$node_pid"
status=0
wait "$node_pid" || status=$?
node_pid=
[[ $status == 0 ]] || { echo "FAILED: the node exited $status on SIGTERM"; exit 1; }
echo "PASSED"
