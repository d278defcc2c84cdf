# Shell helpers shared by the tests that start a `multidev node` with its
# stdout on a fifo opened as fd 3 (node_bad_input.sh, netns_nodes.sh). They
# set node_pid and node_fd_open=1 once fd 3 is open.

# stop_node SECONDS: SIGTERM, then waits at most SECONDS for the node to exit
# (its stdout, the fifo on fd 3, ends), then SIGKILL; reaps it and sets
# node_status to its exit status (128+N for a signal). `ip netns exec` execs
# the node, so $node_pid is the node itself there too.
node_status=
stop_node() {
  local pid=$node_pid rest got=0
  [ -n "$pid" ] || return 0
  kill -TERM "$pid" 2>/dev/null || true
  if [ "$node_fd_open" = 1 ]; then
    # The node prints nothing more on stdout: read returns 1 at its end (the
    # node exited), above 128 when SECONDS pass first.
    while :; do
      IFS= read -r -t "$1" -u 3 rest || { got=$?; break; }
    done
    if [ "$got" -gt 128 ]; then
      echo "the node did not stop within $1 s of SIGTERM: SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
    fi
  else
    kill -KILL "$pid" 2>/dev/null || true
  fi
  node_status=0
  wait "$pid" 2>/dev/null || node_status=$?
  node_pid=
}


# cleanup_node RC: for a test's exit trap: stops the node if it still runs,
# and shows its stderr ($dir/node.err) when the test failed (RC not 0).
cleanup_node() {
  if [ -n "$node_pid" ]; then
    stop_node 5
    echo "node stopped by the cleanup (exit status $node_status)"
  fi
  if [ "$1" -ne 0 ] && [ -s "$dir/node.err" ]; then
    echo "--- the node's stderr:"
    cat "$dir/node.err"
  fi
}
