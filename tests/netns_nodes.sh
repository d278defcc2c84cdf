#!/bin/bash
# netns_nodes.sh TOOL: a run and a `multidev node` as two hosts, each in its
# own network namespace joined by a veth pair (10.77.X.1 and 10.77.X.2),
# then the link is cut under running work.
#  1. The node (`--bind 10.77.X.2 --allow-remote`, in namespace 2) is
#     attached by a run in namespace 1 and serves a small scenario.
#  2. A run keeps b/0 busy (a 10 s spin, work queued behind it, this
#     process waiting on that work); once the node has spent 0.3 s of CPU
#     on the spin, the link goes down in namespace 1. The heartbeat drops
#     the silent node within about 5 s and the waits fail naming b
#     (`(expect ... (fails (matches "b/multidev_cpu")))`): the run exits 0
#     well within `timeout 60`.
#  3. The link comes back up and a new run attaches the node again.
#  4. Rejoin in one run: a run keeps b/0 busy, the link goes down, the
#     run sees its work fail ("session ended", after the lease and margin);
#     once the node has ended the session (its lease ran out: its stderr
#     says so) the link comes back up, and the same run attaches b again
#     (`(attach b)`: a new session, tried again while the link is still
#     down: under load the run may get there before the node's lease ran
#     out) and works on it.
#  5. SIGTERM stops the node (exit status 0).
# Needs root, network namespaces (`ip netns`) and veth; exits 77 (skipped)
# without. No step sleeps to synchronise: it waits on the node's "listening
# on" line, read from a fifo with a time limit, and on the node's CPU time.
set -euo pipefail

tool=${1:?usage: netns_nodes.sh TOOL}
if [ ! -x "$tool" ]; then
  echo "FAILED: $tool is not an executable"
  exit 1
fi

skip() {
  echo "SKIPPED: cannot create network namespaces here ($*)"
  exit 77
}

[ "$EUID" -eq 0 ] || skip "not root"
command -v ip >/dev/null 2>&1 || skip "the ip command (iproute2) is missing"

x=$(($$ % 200))
ns1=mdnodes1-$$
ns2=mdnodes2-$$
veth1=mdv1-$$ # interface names have at most 15 characters
veth2=mdv2-$$
addr1=10.77.$x.1
addr2=10.77.$x.2

dir=$(mktemp -d "${TMPDIR:-/tmp}/netns_nodes.XXXXXX")
run_pid=
made_ns1=0
made_ns2=0

. "$(dirname "$0")/node_lib.sh" # fail, stop_node, cleanup_node

cleanup() {
  local rc=$?
  set +e
  if [ -n "$run_pid" ]; then
    # timeout passes SIGTERM on to the run, then SIGKILL (-k 5).
    kill -TERM "$run_pid" 2>/dev/null
    wait "$run_pid" 2>/dev/null
  fi
  cleanup_node "$rc"
  exec 3<&- 4<&-
  # Deleting a namespace deletes the veth end in it, and with it the pair.
  [ "$made_ns1" = 0 ] || ip netns del "$ns1" 2>/dev/null
  [ "$made_ns2" = 0 ] || ip netns del "$ns2" 2>/dev/null
  ip link del "$veth1" 2>/dev/null # still here if moving it failed
  rm -rf "$dir"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# -- the two hosts -------------------------------------------------------------
err=$(ip netns add "$ns1" 2>&1) || skip "ip netns add: ${err:-failed}"
made_ns1=1
err=$(ip netns add "$ns2" 2>&1) || skip "ip netns add: ${err:-failed}"
made_ns2=1
err=$(ip netns exec "$ns1" true 2>&1) || skip "ip netns exec: ${err:-failed}"
err=$(ip link add "$veth1" type veth peer name "$veth2" 2>&1) ||
  skip "ip link add type veth: ${err:-failed}"
ip link set "$veth1" netns "$ns1"
ip link set "$veth2" netns "$ns2"
ip -n "$ns1" addr add "$addr1/24" dev "$veth1"
ip -n "$ns2" addr add "$addr2/24" dev "$veth2"
for ns in "$ns1" "$ns2"; do
  ip -n "$ns" link set lo up
done
ip -n "$ns1" link set "$veth1" up
ip -n "$ns2" link set "$veth2" up
echo "namespaces $ns1 ($veth1 $addr1) and $ns2 ($veth2 $addr2)"

# -- the node, in namespace 2 --------------------------------------------------
mkfifo "$dir/node.out"
ip netns exec "$ns2" "$tool" node --bind "$addr2" --allow-remote --port 0 --cpu-devices 1 \
  --name b >"$dir/node.out" 2>"$dir/node.err" &
node_pid=$!
exec 3<"$dir/node.out" # returns once the node's side has the fifo open
node_fd_open=1
line=
if ! IFS= read -r -t 30 -u 3 line || [[ $line != "listening on $addr2:"* ]]; then
  fail "the node did not print 'listening on $addr2:PORT' within 30 s (got '$line')"
fi
port=${line##*:}
echo "node b in $ns2 (pid $node_pid): $line"

cat >"$dir/serves.scn" <<'EOF'
(scenario netns-serves)
(devices 1)
(nodes (b 1))
(tnode x (floats 1024))
(context c0 0) (context cb b/0)
(from-host c0 x (fill 1))
(copy x (from c0) (to cb))              ; the bytes cross the veth pair
(kernel cb scale x 3 (as tripled))
(checksum cb x (as sum))
(to-host cb x (as out))
(expect (sync tripled) ok)
(expect (checksum sum) (sum 3072) (count 1024))
(expect (host out) (all 3))
EOF

# run_serves WHAT: the scenario above, from namespace 1; it must pass.
run_serves() {
  local rc=0
  echo "$1: a run in $ns1 attaches b=$addr2:$port"
  timeout -k 5 60 ip netns exec "$ns1" "$tool" run "$dir/serves.scn" --node "b=$addr2:$port" \
    --step-timeout 20 >"$dir/serves.out" 2>&1 3<&- || rc=$?
  sed 's/^/  /' "$dir/serves.out"
  [ "$rc" -eq 0 ] || fail "$1: the run exited $rc, not 0"
  grep -q '^PASSED' "$dir/serves.out" || fail "$1: the run did not say PASSED"
}

# -- 1. the node serves across the link ----------------------------------------
run_serves "1. across the link"

# -- 2. the link is cut under running work -------------------------------------
cat >"$dir/cut.scn" <<'EOF'
(scenario netns-cut)
(devices 1)
(nodes (b 1))
(context c0 0) (context cb b/0)
(kernel cb spin_ns 0 (as warm))
(expect (sync warm) ok)                 ; attached and serving
(kernel cb spin_ns 10000000000 (as busy)) ; b/0 busy for 10 s...
(kernel cb spin_ns 0 (as queued))       ; ...with work queued behind
(wait c0 queued)                        ; this process waits for it
(kernel c0 spin_ns 0 (as waits_for_b))
; The link goes down now: the heartbeat drops the silent node (5 s).
(expect (sync waits_for_b) (fails (matches "b/multidev_cpu")))
(expect (sync queued) (fails (matches "b/multidev_cpu")))
(expect (kernel cb spin_ns 0) (fails (matches "b/multidev_cpu")))
EOF
echo "2. a run in $ns1 keeps b/0 busy; the link goes down under it"
# The node's CPU time (utime + stime, in clock ticks) shows the 10 s spin on
# b/0 running: an idle node uses next to none (the work-sharing scheduler
# sleeps when idle). 0.3 s of it means the run has attached, synced
# on warm and scheduled busy (and queued right after it).
# node_cpu_ticks: sets ticks to the node's CPU time.
node_cpu_ticks() {
  local stat f
  stat=$(cat "/proc/$node_pid/stat" 2>/dev/null) || fail "the node (pid $node_pid) is gone"
  stat=${stat##*) } # fields from the 3rd on: utime is the 14th, stime the 15th
  read -r -a f <<<"$stat"
  ticks=$((f[11] + f[12]))
}
ticks_per_s=$(getconf CLK_TCK)
# wait_until_node_busy WHAT: waits until the node has used 0.3 s of CPU
# since `cpu0` (then `used` holds its ticks), reading the output of the run
# WHAT on fd 4. Piped, the run prints nothing before its summary: a line (or
# the end of its output) before then means it ended early. Each read waits
# at most 0.1 s for that; at most 300 of them (30 s).
wait_until_node_busy() {
  for ((i = 0; i < 300; i++)); do
    early=
    got=0
    IFS= read -r -t 0.1 -u 4 early || got=$?
    if [ "$got" -le 128 ]; then
      fail "$1 ended before b/0 got busy: $early$(timeout 10 cat <&4)"
    fi
    node_cpu_ticks
    used=$((ticks - cpu0))
    if [ "$used" -ge $((ticks_per_s * 3 / 10)) ]; then
      return 0
    fi
  done
  fail "b/0 did not get busy within 30 s of $1's start (node CPU: $used ticks)"
}
node_cpu_ticks
cpu0=$ticks
mkfifo "$dir/cut.out"
timeout -k 5 60 ip netns exec "$ns1" "$tool" run "$dir/cut.scn" --node "b=$addr2:$port" \
  --step-timeout 30 --report "$dir/cut.report" >"$dir/cut.out" 2>&1 3<&- &
run_pid=$!
exec 4<"$dir/cut.out"
wait_until_node_busy "the run"
ip -n "$ns1" link set "$veth1" down
echo "  the node has used $((used * 1000 / ticks_per_s)) ms of CPU since the run started: $veth1 set down in $ns1"
rc=0
wait "$run_pid" || rc=$?
run_pid=
timeout 10 cat <&4 | sed 's/^/  /'
exec 4<&-
if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
  fail "the run did not end within 60 s (a hang after the cut)"
fi
[ "$rc" -eq 0 ] || fail "the run exited $rc, not 0 (each wait on b must fail naming b)"
grep -q 'b/multidev_cpu' "$dir/cut.report" ||
  fail "the report does not name b/multidev_cpu"
echo "  what the expectations observed, from the report:"
grep -o '(observed "[^"]*")' "$dir/cut.report" | sed 's/^/    /'

# -- 3. the link back up: the node serves a new run ----------------------------
ip -n "$ns1" link set "$veth1" up
echo "3. $veth1 set up again in $ns1"
run_serves "3. after the cut"

# -- 4. rejoin after a cut link, in one run -------------------------------------
cat >"$dir/rejoin.scn" <<'EOF'
(scenario netns-rejoin)
(devices 1)
(nodes (b 1))
(context c0 0) (context cb b/0)
(kernel cb spin_ns 0 (as warm))
(expect (sync warm) ok)                 ; attached and serving
(kernel cb spin_ns 10000000000 (as busy)) ; b/0 busy for 10 s...
(kernel cb spin_ns 0 (as queued))       ; ...with work queued behind
; The link goes down now: no lease renewal gets through; lost after 4 s.
(expect (sync queued) (fails (matches "session ended")))
; The link is back once the node ended the session: a new one. The
; attach tries again while the link is still down (until the step timeout).
(attach b)
(context cb2 b/0)
(expect (kernel cb2 spin_ns 0) ok)
EOF
echo "4. a run in $ns1 keeps b/0 busy; the link goes down, comes back, and the run attaches b again"
ran_out_before=$(grep -c 'ran out' "$dir/node.err" || true)
node_cpu_ticks
cpu0=$ticks
mkfifo "$dir/rejoin.out"
timeout -k 5 60 ip netns exec "$ns1" "$tool" run "$dir/rejoin.scn" --node "b=$addr2:$port" \
  --step-timeout 30 >"$dir/rejoin.out" 2>&1 3<&- &
run_pid=$!
exec 4<"$dir/rejoin.out"
wait_until_node_busy "the rejoin run"
ip -n "$ns1" link set "$veth1" down
echo "  $veth1 set down in $ns1"
# The node ends the session once its lease runs out (3 s without a
# renewal): its stderr says so. At most 300 looks, 0.1 s apart (30 s).
back=0
for ((i = 0; i < 300; i++)); do
  if [ "$(grep -c 'ran out' "$dir/node.err" || true)" -gt "$ran_out_before" ]; then
    back=1
    break
  fi
  got=0
  IFS= read -r -t 0.1 -u 4 early || got=$?
  if [ "$got" -le 128 ]; then
    fail "the rejoin run ended before the node ended its session: $early$(timeout 10 cat <&4)"
  fi
done
[ "$back" = 1 ] || fail "the node did not end the cut-off session within 30 s"
ip -n "$ns1" link set "$veth1" up
echo "  the node ended the session: $veth1 set up again"
grep 'ran out' "$dir/node.err" | tail -1 | sed 's/^/    /'
rc=0
wait "$run_pid" || rc=$?
run_pid=
timeout 10 cat <&4 | sed 's/^/  /'
exec 4<&-
[ "$rc" -eq 0 ] || fail "the rejoin run exited $rc, not 0"

# -- 5. a clean stop -----------------------------------------------------------
echo "5. SIGTERM to the node"
stop_node 30
[ "$node_status" -eq 0 ] || fail "the node exited with status $node_status after SIGTERM, not 0"
echo "  the node exited 0"
echo "PASSED: the node served across namespaces, its waits failed naming b when the link was cut, and it served again, and a run attached it again after a cut"
