# Shell helpers shared by the tests that start a `multidev node` with its
# stdout on a fifo opened as fd 3 (node_bad_input.sh, node_start_stop.sh,
# netns_nodes.sh). They set node_pid and node_fd_open=1 once fd 3 is open.
# The TLS tests (tls_nodes.sh, tls_node_loss.sh) use need_openssl.

# start_node SECONDS COMMAND...: starts `COMMAND... node --port 0
# --cpu-devices 1 --name b` with its stdout on the fifo $dir/node.out (fd 3)
# and its stderr in $dir/node.err, and reads its first line into `line`
# (at most SECONDS). Returns 0 with `port` set when that line is "listening
# on ADDR:PORT", 1 otherwise (the node left running: stop_node ends it).
start_node() {
  local seconds=$1
  shift
  mkfifo "$dir/node.out"
  "$@" node --port 0 --cpu-devices 1 --name b >"$dir/node.out" 2>"$dir/node.err" &
  node_pid=$!
  # Opening the fifo returns once the node's side has it open for writing.
  exec 3<"$dir/node.out"
  node_fd_open=1
  line=
  if ! IFS= read -r -t "$seconds" -u 3 line || [[ $line != "listening on "* ]]; then
    return 1
  fi
  port=${line##*:}
}

# The node's state (set by start_node, cleared by stop_node), and how a test
# gives up.
node_pid=
node_fd_open=0
fail() {
  echo "FAILED: $*"
  exit 1
}

# need_tool PATH: fails unless PATH is an executable (the tool under test).
need_tool() {
  [ -x "$1" ] || fail "$1 is not an executable"
}

# need_openssl: exits 77 (the test is skipped) when the openssl command,
# which makes the TLS test certificates, is not installed.
need_openssl() {
  if ! command -v openssl >/dev/null; then
    echo "SKIPPED: the openssl command is not installed (Debian package openssl)"
    exit 77
  fi
}

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
