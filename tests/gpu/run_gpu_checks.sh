#!/usr/bin/env bash
# The checks that need a GPU, in one go, on a machine that has nvcc, CMake, a
# C++ compiler and Python but none of multidev's Debian packages and no
# package registry (the lent GPU machine; tests/gpu/README.md gives the call):
#
#  1. setup: the packages that tests/gpu/prepare_prefix.sh downloaded into
#     tests/gpu/debs/ are unpacked with `dpkg -x` into a prefix
#     (MULTIDEV_GPU_PREFIX, default /tmp/multidev-gpu-prefix; never /), and
#     the tools and runtimes they need are checked. Without tests/gpu/debs/
#     it builds against the system's packages (a developer's machine).
#  2. build: the CUDA suite, the benchmark and the failure checks, in
#     MULTIDEV_GPU_BUILD_DIR (default build-gpu), with ninja when there is
#     one, for the GPU's architecture; the packages are taken from the
#     prefix, and configure fails when one came from elsewhere.
#  3. checks, each counted passed, failed or skipped, never a skip as a pass:
#     - test_cuda/<case>: the CUDA suite on the real runtime, one verdict a
#       case, read from Boost.Test's XML report (a case that needs two GPUs
#       or steers the fake is skipped there, with its reason);
#     - bench_cuda/<figure>: a chain of tiny kernels against a raw stream
#       with cudaStreamWaitEvent, host<->device copies of 4 KiB to 64 MiB
#       against cudaMemcpyAsync (data checked), the hop and the copy between
#       two GPUs; figures in bench_cuda.json;
#     - gpu_checks/<check>: a device fault (quarantine in bounded time,
#       clean shutdown), a misaligned offset refused, staging memory
#       bounded, one process each;
#     - compute-sanitizer/<tool>: the CUDA suite under memcheck and synccheck
#       (skipped when the toolkit has no compute-sanitizer).
#     Without a GPU every check is skipped, saying why.
#
# The last line is `run_gpu_checks: N passed, N failed, N skipped`. Exit
# status: 1 when anything failed (setup and build included), 77 when nothing
# ran (no GPU), else 0. Results go to ${OUT:-BUILD_DIR/gpu-out}: results.txt
# (one verdict a line), bench_cuda.json, logs.tar.gz (every log).
#
# Usage: tests/gpu/run_gpu_checks.sh [--build-only | --no-build]
#   --build-only  setup and build, no check (then a second call, --no-build,
#                 on the same machine runs the checks)
#   --no-build    reuse the build made before (the prefix must still be there)
# Environment: MULTIDEV_GPU_PREFIX, MULTIDEV_GPU_BUILD_DIR, MULTIDEV_GPU_JOBS
# (default: every core), MULTIDEV_GPU_SANITIZE=0 (no compute-sanitizer run),
# MULTIDEV_GPU_SANITIZER_TIMEOUT (seconds per tool, default 240; cut to what
# is left of MULTIDEV_GPU_TIME_BUDGET, default 570 s from the start, as a
# device call's command runs 600 s at most: a tool with under 60 s left is
# skipped, saying so),
# MULTIDEV_GPU_STAGING_LIMIT_MIB (the staging check's limit, default 16: the driver's bound),
# MULTIDEV_GPU_CUDA_ARCH (CMAKE_CUDA_ARCHITECTURES; default: the GPU's, or
# CMake's default where there is none), CXX, CUDACXX.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

mode=all
for a in "$@"; do
  case "$a" in
    --build-only) mode=build ;;
    --no-build) mode=checks ;;
    -h|--help) sed -n '2,/^set -uo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "run_gpu_checks: unexpected argument '$a' (see --help)" >&2; exit 2 ;;
  esac
done

debs=tests/gpu/debs
prefix="${MULTIDEV_GPU_PREFIX:-/tmp/multidev-gpu-prefix}"
build="${MULTIDEV_GPU_BUILD_DIR:-build-gpu}"
jobs="${MULTIDEV_GPU_JOBS:-$(nproc)}"
out="${OUT:-$build/gpu-out}"
logs="$build/gpu-logs"
bin="$build/bin"
mkdir -p "$logs" "$out"
results="$logs/results.txt"
: > "$results"

# record VERDICT NAME WHY: one check's verdict, a line of $results (which
# the count at the end reads; a subshell may record too).
record() {
  local verdict="$1" name="$2" why="${3:-}"
  case "$verdict" in
    passed|failed|skipped) ;;
    *) why="bad verdict '$verdict': $why"; verdict=failed ;;
  esac
  printf '%s\t%s\t%s\n' "$verdict" "$name" "$why" >> "$results"
}
# count_lines PREFIX FILE: records the `check: NAME: VERDICT: WHY` lines of
# FILE under PREFIX/NAME; prints how many it found.
count_lines() {
  local prefix="$1" file="$2" n=0 name verdict why
  while IFS= read -r line; do
    line="${line#check: }"
    name="${line%%: *}"; line="${line#*: }"
    verdict="${line%%: *}"; why="${line#*: }"
    [ "$verdict" = "$line" ] && why=""
    record "$verdict" "$prefix${prefix:+/}$name" "$why"
    n=$((n + 1))
  done < <(grep -a '^check: ' "$file")
  echo "$n"
}
say() { echo "run_gpu_checks: $*"; }
# unpack_deb DEB DIR: the files of DEB under DIR (`dpkg-deb -x`, or, where
# there is no dpkg, the same in Python: a .deb is an ar archive whose
# data.tar.* holds the files).
unpack_deb() {
  if command -v dpkg-deb >/dev/null 2>&1; then
    dpkg-deb -x "$1" "$2"
  else
    python3 - "$1" "$2" <<'EOF'
import io, sys, tarfile
data = open(sys.argv[1], "rb").read()
assert data[:8] == b"!<arch>\n", "not an ar archive"
pos = 8
while pos + 60 <= len(data):
    name = data[pos:pos + 16].decode().strip().rstrip("/")
    size = int(data[pos + 48:pos + 58].decode().strip())
    body = data[pos + 60:pos + 60 + size]
    if name.startswith("data.tar"):
        kw = {"filter": "tar"} if hasattr(tarfile, "tar_filter") else {}
        tarfile.open(fileobj=io.BytesIO(body)).extractall(sys.argv[2], **kw)
        break
    pos += 60 + size + (size & 1)
else:
    sys.exit("no data.tar in " + sys.argv[1])
EOF
  fi
}
# deb_field DEB FIELD: a control field of DEB (dpkg-deb -f, or from the
# file name, PACKAGE_VERSION_ARCH.deb, for Architecture).
deb_field() {
  if command -v dpkg-deb >/dev/null 2>&1; then
    dpkg-deb -f "$1" "$2"
  elif [ "$2" = Architecture ]; then
    basename "$1" .deb | sed 's/.*_//'
  fi
}

finish() {
  local passed failed skipped
  passed="$(grep -c '^passed' "$results")"
  failed="$(grep -c '^failed' "$results")"
  skipped="$(grep -c '^skipped' "$results")"
  echo
  say "results (also in $out/results.txt):"
  local v
  for v in failed skipped; do
    if grep -q "^$v" "$results"; then
      echo "  $v:"
      grep "^$v" "$results" | cut -f2- | sed 's/\t/: /; s/^/    /'
    fi
  done
  if [ "$passed" -gt 0 ]; then
    echo "  passed: $(grep '^passed' "$results" | cut -f2 | paste -sd ' ' -)"
  fi
  cp "$results" "$out/results.txt"
  tar -czf "$out/logs.tar.gz" -C "$logs" . 2>/dev/null || true
  echo "run_gpu_checks: $passed passed, $failed failed, $skipped skipped"
  if [ "$failed" -gt 0 ]; then exit 1; fi
  if [ "$passed" -eq 0 ]; then exit 77; fi
  exit 0
}
# setup_failed NAME WHY: a failure that stops the run.
setup_failed() {
  say "$1 FAILED: $2"
  record failed "$1" "$2"
  finish
}

# -- 1. setup ---------------------------------------------------------------------------

say "$(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n), $(. /etc/os-release 2>/dev/null && echo "${PRETTY_NAME:-?}")"
gpus=0
compute_cap=""
if command -v nvidia-smi >/dev/null 2>&1; then
  echo "$ nvidia-smi -L"
  smi="$(nvidia-smi -L 2>&1)"
  echo "$smi"
  gpus="$(grep -c '^GPU [0-9]' <<<"$smi" || true)"
  compute_cap="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d ' .')"
fi
say "$gpus GPU(s) listed by nvidia-smi"

cxx="${CXX:-$(command -v g++ || command -v c++ || true)}"
nvcc="${CUDACXX:-$(command -v nvcc || true)}"
[ -z "$nvcc" ] && [ -x /usr/local/cuda/bin/nvcc ] && nvcc=/usr/local/cuda/bin/nvcc
sanitizer="$(command -v compute-sanitizer || true)"
[ -z "$sanitizer" ] && [ -n "$nvcc" ] && [ -x "$(dirname "$nvcc")/compute-sanitizer" ] &&
  sanitizer="$(dirname "$nvcc")/compute-sanitizer"
generator=()
if command -v ninja >/dev/null 2>&1; then generator=(-G Ninja); fi
say "cmake: $(cmake --version 2>/dev/null | head -n 1 || echo missing)"
say "c++: ${cxx:-missing} ($("${cxx:-false}" --version 2>/dev/null | head -n 1))"
say "nvcc: ${nvcc:-missing} ($("${nvcc:-false}" --version 2>/dev/null | tail -n 1))"
say "compute-sanitizer: ${sanitizer:-missing}; generator: ${generator[1]:-Unix Makefiles}; python3: $(python3 --version 2>&1)"

if [ "$mode" != checks ]; then
  command -v cmake >/dev/null || setup_failed setup "no cmake on PATH"
  [ -n "$cxx" ] || setup_failed setup "no C++ compiler (g++, c++ or CXX)"
  command -v python3 >/dev/null || setup_failed setup "no python3 (it reads Boost.Test's report)"
  if [ "$gpus" -gt 0 ] && [ -z "$nvcc" ]; then
    setup_failed setup "nvidia-smi lists $gpus GPU(s) but there is no nvcc (PATH, CUDACXX, /usr/local/cuda/bin)"
  fi
fi

use_prefix=0
if compgen -G "$debs/*.deb" >/dev/null; then
  use_prefix=1
elif [ ! -e /usr/include/caf/config.hpp ]; then
  setup_failed setup "no $debs/*.deb and no CAF installed: run tests/gpu/prepare_prefix.sh on a machine" \
    "with Debian's registry and carry tests/gpu/debs (tests/gpu/README.md)"
fi

if [ "$use_prefix" = 1 ]; then
  multiarch="$(deb_field "$(ls "$debs"/libfmt9_*.deb | head -n 1)" Architecture 2>/dev/null)"
  [ "$multiarch" = amd64 ] && multiarch=x86_64-linux-gnu
  libdir="$prefix/usr/lib/${multiarch:-x86_64-linux-gnu}"
  if [ "$mode" != checks ]; then
    [ -f "$debs/MANIFEST" ] || setup_failed setup "$debs has no MANIFEST (run tests/gpu/prepare_prefix.sh)"
    # Every package the manifest names, unchanged.
    while read -r pkg version size sum; do
      case "$pkg" in '#'*|'') continue ;; esac
      f="$(ls "$debs/${pkg}_"*.deb 2>/dev/null | head -n 1)"
      [ -n "$f" ] || setup_failed setup "$debs lacks $pkg ($version)"
      [ "$(sha256sum "$f" | cut -d' ' -f1)" = "$sum" ] || setup_failed setup "$f does not match its sha256 in MANIFEST"
    done < "$debs/MANIFEST"
    if ! cmp -s "$debs/MANIFEST" "$prefix/.manifest" 2>/dev/null; then
      say "unpacking $(ls "$debs"/*.deb | wc -l) packages ($(du -sh "$debs" | cut -f1)) into $prefix"
      rm -rf "$prefix"
      mkdir -p "$prefix"
      for f in "$debs"/*.deb; do
        unpack_deb "$f" "$prefix" || setup_failed setup "unpacking $f failed"
      done
      cp "$debs/MANIFEST" "$prefix/.manifest"
    else
      say "$prefix already holds the packages of $debs/MANIFEST"
    fi
    # The carried libraries are Debian 12's: glibc 2.34 or newer, and a C++
    # runtime and compiler of GCC 12 or newer (libstdc++6 >= 12).
    glibc="$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')"
    if [ -n "$glibc" ] && [ "$(printf '%s\n2.34\n' "$glibc" | sort -V | head -n 1)" != 2.34 ]; then
      setup_failed setup "glibc $glibc is older than 2.34, which the carried Debian 12 libraries need"
    fi
    libstdcxx="$("$cxx" -print-file-name=libstdc++.so.6 2>/dev/null)"
    if [ -f "$libstdcxx" ] && ! grep -qa 'GLIBCXX_3\.4\.30' "$libstdcxx"; then
      setup_failed setup "$libstdcxx lacks GLIBCXX_3.4.30: the carried libraries need the C++ runtime of GCC 12 or newer"
    fi
    say "glibc ${glibc:-?}; libstdc++: ${libstdcxx:-?}"
  fi
  [ -d "$libdir" ] || setup_failed setup "$libdir is missing (run without --no-build first)"
  export LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi

# -- 2. build ---------------------------------------------------------------------------

targets=(test_cuda bench_cuda gpu_checks)
if [ "$mode" != checks ]; then
  # A build dir of another generator cannot be reused.
  if [ -f "$build/CMakeCache.txt" ] && [ ${#generator[@]} -gt 0 ] &&
     ! grep -q '^CMAKE_GENERATOR:INTERNAL=Ninja$' "$build/CMakeCache.txt"; then
    rm -rf "$build/CMakeCache.txt" "$build/CMakeFiles"
  fi
  config=(-S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo
          -DCMAKE_CXX_COMPILER="$cxx")
  # GCC 13 stopped including <cstdint> through other standard headers; the
  # carried headers (CAF 0.17, Boost 1.74) were written before it, and only
  # GCC 12 built them here. MULTIDEV_GPU_CXXFLAGS (even empty) replaces this.
  cxx_major="$("$cxx" -dumpversion 2>/dev/null | cut -d. -f1)"
  cxxflags="${MULTIDEV_GPU_CXXFLAGS-}"
  if [ -z "${MULTIDEV_GPU_CXXFLAGS+set}" ] && "$cxx" --version 2>/dev/null | grep -qiE 'g\+\+|gcc' &&
     [ "${cxx_major:-0}" -ge 13 ] 2>/dev/null; then
    cxxflags="-include cstdint"
  fi
  [ -n "$cxxflags" ] && config+=(-DCMAKE_CXX_FLAGS="$cxxflags")
  [ -n "$nvcc" ] && config+=(-DCMAKE_CUDA_COMPILER="$nvcc" -DMULTIDEV_CUDA=ON)
  arch="${MULTIDEV_GPU_CUDA_ARCH:-$compute_cap}"
  [ -n "$arch" ] && config+=(-DCMAKE_CUDA_ARCHITECTURES="$arch")
  if [ "$use_prefix" = 1 ]; then
    config+=(-DCMAKE_PREFIX_PATH="$prefix/usr" -DCMAKE_LIBRARY_PATH="$libdir")
  fi
  echo "$ cmake ${config[*]}"
  if ! cmake "${config[@]}" > "$logs/configure.log" 2>&1; then
    tail -n 40 "$logs/configure.log"
    setup_failed build "cmake configure failed (gpu-logs/configure.log)"
  fi
  grep -E '^-- (multidev|The (CXX|CUDA) compiler)' "$logs/configure.log"
  # Where each package came from.
  cache="$build/CMakeCache.txt"
  found=()
  for v in CAF_INCLUDE_DIR CAF_CORE_LIBRARY CAF_IO_LIBRARY CAF_OPENSSL_LIBRARY Boost_DIR \
           boost_unit_test_framework_DIR boost_headers_DIR fmt_DIR CLI11_DIR nlohmann_json_DIR; do
    val="$(grep -E "^$v:[A-Z]+=" "$cache" | head -n 1 | cut -d= -f2-)"
    say "  $v = ${val:-<not set>}"
    found+=("$v=$val")
  done
  if [ "$use_prefix" = 1 ]; then
    for f in "${found[@]}"; do
      v="${f%%=*}"; val="${f#*=}"
      case "$v" in CLI11_DIR|nlohmann_json_DIR|boost_*) [ -z "$val" ] && continue ;; esac
      case "$val" in
        "$prefix"/*) ;;
        *) setup_failed build "$v is '$val', not in the prefix $prefix: a package came from elsewhere" ;;
      esac
    done
  fi
  # The include directories test_cuda.cpp is compiled with.
  python3 - "$build/compile_commands.json" <<'EOF' || true
import json, shlex, sys
for entry in json.load(open(sys.argv[1])):
    if entry["file"].endswith("tests/test_cuda.cpp"):
        args = shlex.split(entry.get("command", "")) or entry.get("arguments", [])
        dirs = [a for a in args if a.startswith("-I")] + \
               [args[i] + " " + args[i + 1] for i, a in enumerate(args[:-1]) if a == "-isystem"]
        print("run_gpu_checks: test_cuda.cpp is compiled with " + " ".join(dirs))
        break
EOF
  echo "$ cmake --build $build --target ${targets[*]} -j $jobs"
  start=$SECONDS
  if ! cmake --build "$build" --target "${targets[@]}" -j "$jobs" > "$logs/build.log" 2>&1; then
    grep -E -B2 -A8 'error|Error' "$logs/build.log" | head -n 60
    setup_failed build "the build failed (gpu-logs/build.log)"
  fi
  say "built ${targets[*]} in $((SECONDS - start)) s"
fi
for t in "${targets[@]}"; do
  [ -x "$bin/$t" ] || setup_failed build "$bin/$t is missing (run without --no-build first)"
done
# Every shared library resolves (from the prefix where there is one).
if command -v ldd >/dev/null 2>&1; then
  for t in "${targets[@]}"; do
    ldd "$bin/$t" > "$logs/ldd_$t.txt" 2>&1
    if grep -q 'not found' "$logs/ldd_$t.txt"; then
      grep 'not found' "$logs/ldd_$t.txt"
      setup_failed setup "$bin/$t has libraries the loader cannot find"
    fi
  done
  say "libraries of test_cuda: $(grep -oE '=> [^ ]+' "$logs/ldd_test_cuda.txt" |
        grep -E 'caf|boost|fmt|ssl|crypto' | sed 's/=> //' | paste -sd ' ' -)"
fi
if [ "$mode" = build ]; then
  say "built; run again with --no-build for the checks"
  exit 0
fi

# -- 3. checks --------------------------------------------------------------------------

echo "$ $bin/gpu_checks --devices"
"$bin/gpu_checks" --devices > "$logs/devices.txt" 2>&1
cat "$logs/devices.txt"
cuda_gpus="$(sed -n 's/^cuda devices: \([0-9]*\)$/\1/p' "$logs/devices.txt")"
cuda_gpus="${cuda_gpus:-0}"
no_gpu=""
if [ "$gpus" -eq 0 ] && [ "$cuda_gpus" -eq 0 ]; then
  no_gpu="no GPU here ($(sed -n 's/.*(unavailable "\(.*\)") (devices.*/\1/p' "$logs/devices.txt" | head -n 1))"
  record skipped devices "$no_gpu"
elif [ "$cuda_gpus" -ne "$gpus" ]; then
  record failed devices "nvidia-smi lists $gpus GPU(s), multidev's cuda backend $cuda_gpus (see gpu-logs/devices.txt)"
else
  record passed devices "$cuda_gpus GPU(s)"
fi

# test_cuda on the real runtime: one verdict per case.
say "test_cuda on the real runtime"
env -u MULTIDEV_TEST_CUDA "$bin/test_cuda" --list_content > "$logs/test_cuda.list" 2>&1
status=0
MULTIDEV_TEST_CUDA=real timeout 300 "$bin/test_cuda" --color_output=no --log_level=test_suite \
  --report_format=XML --report_level=detailed --report_sink="$logs/test_cuda.report.xml" \
  > "$logs/test_cuda.log" 2>&1 || status=$?
grep -E 'error|skipped because|SKIPPED|Leaving test module' "$logs/test_cuda.log" | head -n 40
if [ "$status" -eq 77 ]; then
  why="$(sed -n 's/^SKIPPED: //p' "$logs/test_cuda.log" | head -n 1)"
  python3 tests/gpu/boost_cases.py --prefix test_cuda --list "$logs/test_cuda.list" \
    --skipped-why "${why:-exit status 77}" > "$logs/test_cuda.checks"
else
  [ "$status" -eq 124 ] && echo "check: test_cuda: failed: did not finish within 300 s" >> "$logs/test_cuda.log"
  python3 tests/gpu/boost_cases.py --prefix test_cuda --list "$logs/test_cuda.list" \
    --report "$logs/test_cuda.report.xml" --log "$logs/test_cuda.log" --status "$status" \
    > "$logs/test_cuda.checks"
fi
count_lines "" "$logs/test_cuda.checks" > /dev/null

# bench_cuda: one verdict per figure.
say "bench_cuda"
status=0
timeout 300 "$bin/bench_cuda" --json "$out/bench_cuda.json" > "$logs/bench_cuda.log" 2>&1 || status=$?
cat "$logs/bench_cuda.log"
n="$(count_lines bench_cuda "$logs/bench_cuda.log")"
if [ "$n" -eq 0 ] || { [ "$status" -ne 0 ] && [ "$status" -ne 77 ] && ! grep -q '^check: .*: failed' "$logs/bench_cuda.log"; }; then
  record failed bench_cuda "exit status $status after $n verdict(s): $(tail -n 1 "$logs/bench_cuda.log")"
fi

# gpu_checks: one process per check.
for check in $("$bin/gpu_checks" --list); do
  say "gpu_checks --check $check"
  status=0
  timeout 180 "$bin/gpu_checks" --check "$check" \
    --staging-limit-mib "${MULTIDEV_GPU_STAGING_LIMIT_MIB:-16}" > "$logs/gpu_check_$check.log" 2>&1 || status=$?
  cat "$logs/gpu_check_$check.log"
  n="$(count_lines gpu_checks "$logs/gpu_check_$check.log")"
  if [ "$n" -eq 0 ]; then
    record failed "gpu_checks/$check" "no verdict, exit status $status (gpu-logs/gpu_check_$check.log)"
  fi
done

# The CUDA suite under compute-sanitizer. API errors are not counted: the
# suite asks for allocations no device holds on purpose.
for tool in memcheck synccheck; do
  name="compute-sanitizer/$tool"
  if [ -n "$no_gpu" ]; then record skipped "$name" "$no_gpu"; continue; fi
  if [ "${MULTIDEV_GPU_SANITIZE:-1}" = 0 ]; then record skipped "$name" "MULTIDEV_GPU_SANITIZE=0"; continue; fi
  if [ -z "$sanitizer" ]; then record skipped "$name" "no compute-sanitizer in the toolkit"; continue; fi
  limit="${MULTIDEV_GPU_SANITIZER_TIMEOUT:-240}"
  left=$(( ${MULTIDEV_GPU_TIME_BUDGET:-570} - SECONDS - 10 ))
  if [ "$left" -lt 60 ]; then
    record skipped "$name" "no time left: ${SECONDS} s of the ${MULTIDEV_GPU_TIME_BUDGET:-570} s budget spent (MULTIDEV_GPU_TIME_BUDGET)"
    continue
  fi
  [ "$left" -lt "$limit" ] && limit="$left"
  say "test_cuda under compute-sanitizer --tool $tool (at most $limit s)"
  status=0
  MULTIDEV_TEST_CUDA=real timeout "$limit" "$sanitizer" --tool "$tool" --error-exitcode 86 \
    --report-api-errors no "$bin/test_cuda" --color_output=no --log_level=test_suite \
    > "$logs/sanitizer_$tool.log" 2>&1 || status=$?
  summary="$(grep -a 'ERROR SUMMARY' "$logs/sanitizer_$tool.log" | tail -n 1 | sed 's/^=* *//')"
  echo "${summary:-no ERROR SUMMARY}"
  case "$status" in
    0) record passed "$name" "${summary:-exit status 0}" ;;
    77) record skipped "$name" "$(sed -n 's/^SKIPPED: //p' "$logs/sanitizer_$tool.log" | head -n 1)" ;;
    86) record failed "$name" "$summary; first: $(grep -a -m 1 -E '^=+ +(Invalid|Race|Barrier|Error|Program hit)' "$logs/sanitizer_$tool.log" | sed 's/^=* *//')" ;;
    124) record failed "$name" "did not finish within $limit s (MULTIDEV_GPU_SANITIZER_TIMEOUT)" ;;
    *) record failed "$name" "exit status $status: test_cuda failed under the sanitizer (gpu-logs/sanitizer_$tool.log)" ;;
  esac
done

finish
