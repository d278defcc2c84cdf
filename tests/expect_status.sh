#!/bin/sh
# expect_status.sh STATUS COMMAND [ARGS...]: runs COMMAND and prints
# "status STATUS ok" when it exits with STATUS (for a usage error, 2, also
# when it printed exactly one line to stderr and nothing to stdout), then
# what it printed. CTest's PASS_REGULAR_EXPRESSION ignores exit codes, so the
# tests match that first line together with the message.
want=$1
shift
out=$(mktemp) && err=$(mktemp) || exit 1
"$@" >"$out" 2>"$err"
got=$?
if [ "$got" -ne "$want" ]; then
  echo "status MISMATCH: wanted $want, got $got"
elif [ "$want" -eq 2 ] && { [ "$(wc -l <"$err")" -ne 1 ] || [ -s "$out" ]; }; then
  echo "status $want but MISMATCH: a usage error prints one line on stderr and nothing on stdout"
else
  echo "status $want ok"
fi
cat "$out" "$err"
rm -f "$out" "$err"
