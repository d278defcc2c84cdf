#!/usr/bin/env bash
# Checks scripts/tsan-classify.py on the reports of tests/tsan_classify/:
#  - noise_inlined_special.log: a project type's implicit destructor and
#    constructor, and a closure's destructor, inlined (TSan names the frames
#    "~T", "T", "~<lambda>"), called by CAF on both sides: noise, as the
#    script's rule says (CAF I/O once left a stateful actor's state to the
#    multiplexer thread, and CI kept that report);
#  - noise_deserialized.log: a message's inspect function run by CAF's
#    deserializer on one I/O thread, the handler reading the message on
#    another: noise (CI kept it when two clients' messages reached a node);
#  - kept_relative.log: every side in project code, written with the
#    relative paths ccache's base_dir leaves in the debug info: kept (read
#    as outside the repository, every local TSan run passed unseen).
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail=0
sed "s|@ROOT@|$root|g" "$root/tests/tsan_classify/noise_inlined_special.log" >"$work/noise.log"
if ! out=$(python3 "$root/scripts/tsan-classify.py" --root "$root" --build-dir "$root/build" "$work/noise.log"); then
  echo "FAIL: implicit special members inlined were kept:"; echo "$out"; fail=1
fi
grep -q "2 report(s): 2 noise" <<<"$out" || { echo "FAIL: expected 2 noise reports:"; echo "$out"; fail=1; }
sed "s|@ROOT@|$root|g" "$root/tests/tsan_classify/noise_deserialized.log" >"$work/deserialized.log"
if ! out=$(python3 "$root/scripts/tsan-classify.py" --root "$root" --build-dir "$root/build" "$work/deserialized.log"); then
  echo "FAIL: a message deserialized by CAF and read by a handler was kept:"; echo "$out"; fail=1
fi
grep -q "1 report(s): 1 noise" <<<"$out" || { echo "FAIL: expected 1 noise report:"; echo "$out"; fail=1; }
if out=$(python3 "$root/scripts/tsan-classify.py" --root "$root" --build-dir "$root/build" \
           "$root/tests/tsan_classify/kept_relative.log"); then
  echo "FAIL: a report with every side in the repository (relative paths) was not kept:"; echo "$out"; fail=1
fi
grep -q "1 report(s): 0 noise .* 1 kept" <<<"$out" || { echo "FAIL: expected 1 kept report:"; echo "$out"; fail=1; }
[ "$fail" = 0 ] && echo "tsan-classify: all cases as expected"
exit "$fail"
