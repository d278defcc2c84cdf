#!/bin/bash
# node_bind_resolved.sh TOOL: `multidev node --bind NAME` checks the addresses
# NAME resolves to, not its text (issue 38 point 5). In a user and mount
# namespace of its own (unshare -rm: no root needed), /etc/hosts is replaced
# by one that maps 127.evil.test to 0.0.0.0 (every interface); the node must
# refuse to listen there without --allow-remote (status 2, naming the name
# and the address), and listen on localhost as before. Exits 77 (skipped)
# where user namespaces are not allowed.
set -uo pipefail

tool=${1:?usage: node_bind_resolved.sh TOOL}
if ! unshare -rm true 2>/dev/null; then
  echo "SKIPPED: unshare -rm (user and mount namespaces) is not allowed here"
  exit 77
fi
dir=$(mktemp -d "${TMPDIR:-/tmp}/node_bind.XXXXXX")
trap 'rm -rf "$dir"' EXIT
printf '127.0.0.1 localhost\n0.0.0.0 127.evil.test\n' >"$dir/hosts"

# In the namespace: the hosts file over /etc/hosts, then the node, which must
# refuse at once; `timeout` bounds one that would listen instead (status 124).
unshare -rm bash -c '
  mount --bind "$1/hosts" /etc/hosts || exit 99
  getent ahosts 127.evil.test | head -1
  timeout -k 2 5 "$2" node --bind 127.evil.test --port 0 </dev/null >"$1/out" 2>"$1/err"
' _ "$dir" "$tool"
rc=$?
echo "status $rc; stdout: $(cat "$dir/out" 2>/dev/null); stderr: $(cat "$dir/err" 2>/dev/null)"
if [ "$rc" = 99 ]; then
  echo "SKIPPED: cannot bind-mount a hosts file in the namespace"
  exit 77
fi
if [ "$rc" != 2 ]; then
  echo "FAILED: --bind 127.evil.test (0.0.0.0) was not refused: status $rc"
  exit 1
fi
if ! grep -q -- "--bind 127.evil.test resolves to 0.0.0.0, which is not a loopback address" "$dir/err"; then
  echo "FAILED: the refusal does not name the bind and the address"
  exit 1
fi
echo "PASSED"
