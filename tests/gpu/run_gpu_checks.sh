#!/usr/bin/env bash
# The checks that need a GPU, in one go from a clean tree (a few minutes on a
# 16-core machine): build what they need (scripts/setup.sh, with every core),
# list the GPUs, run the CTest label `gpu` (test_cuda_gpu: the CUDA suite on
# the real runtime; bench_cuda_smoke), print `multidev devices --backend cuda
# --limits`, run bench_cuda and write its figures to
# ${OUT:-build}/bench_cuda.json.
#
# Exit status: 0 when all passed; 77 where there is no GPU at all; 1 when
# anything failed, including a GPU test that skipped although the machine
# has a GPU (e.g. a build without the CUDA Toolkit).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

step="start"
on_exit() {
  local rc=$?
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 77 ]; then
    echo "run_gpu_checks: FAILED at: $step (exit status $rc)"
  fi
}
trap on_exit EXIT

fail() {
  echo "run_gpu_checks: $*" >&2
  exit 1
}

out_dir="${OUT:-build}"
jobs="$(nproc)"

# Without a driver device node nor nvidia-smi there is no GPU: no build.
if ! command -v nvidia-smi >/dev/null 2>&1 && ! compgen -G '/dev/nvidia[0-9]*' >/dev/null \
   && [ ! -e /dev/dxg ]; then
  echo "run_gpu_checks: no GPU here (no nvidia-smi, no /dev/nvidia*)"
  exit 77
fi

step="build (scripts/setup.sh)"
# setup.sh builds through the `default` build preset, which says 2 jobs; the
# -j after the targets (setup.sh hands its arguments to `cmake --build
# --target`) and CMAKE_BUILD_PARALLEL_LEVEL both override that.
export CMAKE_BUILD_PARALLEL_LEVEL="$jobs"
scripts/setup.sh multidev_tool test_cuda bench_cuda -j "$jobs"

step="GPU inventory"
smi_gpus=0
if command -v nvidia-smi >/dev/null 2>&1; then
  echo "$ nvidia-smi -L"
  smi_out="$(nvidia-smi -L 2>&1)" || true
  echo "$smi_out"
  smi_gpus="$(grep -c '^GPU [0-9]' <<<"$smi_out" || true)"
fi
devices_out="$(build/bin/multidev devices --backend cuda)"
cuda_gpus="$(grep -o 'num_devices [0-9]*' <<<"$devices_out" | head -n 1 | awk '{print $2}')"
cuda_gpus="${cuda_gpus:-0}"
if [ "$cuda_gpus" -eq 0 ]; then
  if [ "$smi_gpus" -eq 0 ]; then
    echo "$devices_out"
    echo "run_gpu_checks: no GPU here"
    exit 77
  fi
  echo "$devices_out"
  fail "nvidia-smi lists $smi_gpus GPU(s) but multidev's cuda backend has none (see its" \
       "'unavailable' reason above; 'no CUDA runtime' means nvcc was not found at configure:" \
       "put it on PATH, set CUDACXX or install it in /usr/local/cuda)"
fi
echo "run_gpu_checks: multidev_cuda has $cuda_gpus device(s)"

step="ctest -L gpu"
ctest_log="$(mktemp)"
ctest_rc=0
ctest --test-dir build -L gpu --output-on-failure 2>&1 | tee "$ctest_log" || ctest_rc=$?
if [ "$ctest_rc" -ne 0 ]; then
  fail "ctest -L gpu failed (exit status $ctest_rc)"
fi
if grep -q 'No tests were found' "$ctest_log"; then
  fail "ctest -L gpu found no test"
fi
if grep -q -E '\*\*\*Skipped|\(Skipped\)|Not Run' "$ctest_log"; then
  fail "a gpu test was skipped on a machine with $cuda_gpus GPU(s)"
fi
if ! grep -q -E 'test_cuda_gpu \.+ +Passed' "$ctest_log"; then
  fail "test_cuda_gpu did not run and pass"
fi
gpu_tests="$(grep -c -E ' Test +#[0-9]+: .* Passed' "$ctest_log" || true)"
rm -f "$ctest_log"

step="multidev devices --backend cuda --limits"
echo "$ build/bin/multidev devices --backend cuda --limits"
build/bin/multidev devices --backend cuda --limits

step="bench_cuda"
mkdir -p "$out_dir"
json="$out_dir/bench_cuda.json"
echo "$ build/bin/bench_cuda --json $json"
bench_out="$(build/bin/bench_cuda --json "$json")"
echo "$bench_out"
if ! grep -q '^bench_cuda: done$' <<<"$bench_out"; then
  fail "bench_cuda did not measure (it has to, with $cuda_gpus GPU(s))"
fi
ratios="$(sed -n 's/^\([A-Za-z0-9_]*\): multidev .*, ratio \([0-9.]*\) .*/\1 \2/p' <<<"$bench_out" \
          | paste -sd ',' - | sed 's/,/, /g')"

step="summary"
echo "run_gpu_checks: PASSED: $cuda_gpus GPU(s); ctest -L gpu: $gpu_tests test(s) passed, none skipped;" \
     "bench_cuda ratios (multidev/baseline): ${ratios:-none}; figures in $json"
