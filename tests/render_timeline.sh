#!/bin/sh
# Renders a scenario's --timeline SVG with headless Chromium (Debian
# `chromium`) to a PNG, and checks the picture: a PNG of the SVG's size that
# is not blank. Usage: render_timeline.sh TOOL SCRIPT OUTDIR
# Exits 77 (CTest: skipped) with a visible message when chromium is missing.
set -eu
tool=$1
script=$2
out=$3
if ! command -v chromium >/dev/null 2>&1; then
  echo "SKIPPED: chromium is not installed (apt-get install chromium renders the timeline)"
  exit 77
fi
rm -rf "$out"
mkdir -p "$out"
"$tool" run "$script" --timeline "$out/timeline.svg" >/dev/null
# The window is the SVG's own size, read from its first line.
width=$(sed -n '1s/.* width="\([0-9.]*\)".*/\1/p' "$out/timeline.svg" | cut -d. -f1)
height=$(sed -n '1s/.* height="\([0-9.]*\)".*/\1/p' "$out/timeline.svg" | cut -d. -f1)
if [ -z "$width" ] || [ -z "$height" ]; then
  echo "FAILED: no width/height on the SVG's first line"
  exit 1
fi
# --no-sandbox: CI runs as root, where Chromium's sandbox refuses to start.
timeout 120 chromium --headless --no-sandbox --disable-gpu --hide-scrollbars \
  --user-data-dir="$out/profile" --window-size="$width,$height" \
  --screenshot="$out/timeline.png" "file://$(cd "$out" && pwd)/timeline.svg" \
  >"$out/chromium.log" 2>&1 || { cat "$out/chromium.log"; echo "FAILED: chromium"; exit 1; }
if [ ! -s "$out/timeline.png" ]; then
  echo "FAILED: chromium wrote no PNG"
  cat "$out/chromium.log"
  exit 1
fi
signature=$(head -c 8 "$out/timeline.png" | od -An -tx1 | tr -d ' \n')
if [ "$signature" != "89504e470d0a1a0a" ]; then
  echo "FAILED: $out/timeline.png is not a PNG ($signature)"
  exit 1
fi
# A blank page compresses to a few hundred bytes; lanes, slices and text do not.
size=$(wc -c <"$out/timeline.png")
if [ "$size" -lt 8000 ]; then
  echo "FAILED: $out/timeline.png has only $size bytes (blank?)"
  exit 1
fi
echo "rendered $out/timeline.png (${width}x${height}, $size bytes)"
