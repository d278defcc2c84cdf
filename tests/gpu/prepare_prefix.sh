#!/usr/bin/env bash
# Downloads, here (a machine with Debian's package registry), the Debian
# packages that multidev builds and links against into tests/gpu/debs/
# (git-ignored), for tests/gpu/run_gpu_checks.sh to unpack with `dpkg -x`
# into a prefix on the lent GPU machine, which has nvcc, CMake, ninja and
# Python but none of these packages and no registry. The device call carries
# the folder (tests/gpu/README.md gives the call).
#
# What it takes: CAF (headers and its core, io and openssl libraries), libssl3
# (libcaf_openssl needs it), Boost.Test and the Boost headers it includes,
# fmt, CLI11, nlohmann-json. Not oneTBB nor StarPU: the bench peers they are
# for are optional (tools/CMakeLists.txt) and no GPU check uses them.
#
# It refuses to finish when a package depends on one that is neither in the
# list nor among those the GPU machine is assumed to have (the C and C++
# runtimes and the compiler's own headers, which run_gpu_checks.sh checks
# there before it builds), or when the folder exceeds its size limit
# (MULTIDEV_GPU_DEBS_MAX_MIB, default 48: a device call carries 64 MiB in
# all, the working tree included). It writes debs/MANIFEST (package,
# version, size, sha256) and prints the folder's total size.
#
# Usage: tests/gpu/prepare_prefix.sh [--no-update]
#   --no-update  skip `apt-get update` (the package lists are recent)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
debs="$here/debs"
max_mib="${MULTIDEV_GPU_DEBS_MAX_MIB:-48}"

# The packages carried. Runtime libraries and their -dev packages both:
# dpkg -x unpacks files only, so every shared library the build links, and
# every one those need, must be here or on the GPU machine.
packages=(
  libcaf-dev libcaf-core0.17 libcaf-io0.17 libcaf-openssl0.17 libssl3
  libboost1.74-dev libboost-test1.74-dev libboost-test1.74.0
  libfmt-dev libfmt9
  libcli11-dev
  nlohmann-json3-dev
)
# What the GPU machine is assumed to have (any distribution's C and C++
# runtimes, new enough: run_gpu_checks.sh checks the versions before it
# builds). libstdc++-12-dev: libboost1.74-dev asks for the C++ headers, which
# the machine's own g++ brings.
assumed=(libc6 libgcc-s1 libstdc++6 libstdc++-12-dev)

update=1
for a in "$@"; do
  case "$a" in
    --no-update) update=0 ;;
    -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "prepare_prefix: unexpected argument '$a' (see --help)" >&2; exit 2 ;;
  esac
done

if [ "$update" = 1 ]; then
  echo "prepare_prefix: apt-get update"
  apt-get update -qq
fi

rm -rf "$debs"
mkdir -p "$debs"
cd "$debs"
echo "prepare_prefix: apt-get download ${packages[*]}"
# As root, apt warns that it downloads unsandboxed into a folder its _apt
# user cannot write; that is expected here.
apt-get download -q "${packages[@]}" 2> >(grep -v 'unsandboxed' >&2)

# Every dependency of a carried package is carried or assumed.
missing=()
for f in *.deb; do
  pkg="$(dpkg-deb -f "$f" Package)"
  deps="$( (dpkg-deb -f "$f" Depends; dpkg-deb -f "$f" Pre-Depends) | tr ',' '\n' | sed 's/(.*)//; s/|.*//; s/:any//; s/ //g' | sed '/^$/d')"
  for d in $deps; do
    if ! printf '%s\n' "${packages[@]}" "${assumed[@]}" | grep -qx "$d"; then
      missing+=("$pkg -> $d")
    fi
  done
done
if [ ${#missing[@]} -gt 0 ]; then
  printf 'prepare_prefix: a dependency is neither carried nor assumed: %s\n' "${missing[@]}" >&2
  exit 1
fi

{
  echo "# tests/gpu/prepare_prefix.sh, $(date -u +%Y-%m-%dT%H:%M:%SZ), on $(. /etc/os-release && echo "$PRETTY_NAME")"
  echo "# package version bytes sha256"
  for f in *.deb; do
    printf '%s %s %s %s\n' "$(dpkg-deb -f "$f" Package)" "$(dpkg-deb -f "$f" Version)" \
      "$(stat -c %s "$f")" "$(sha256sum "$f" | cut -d' ' -f1)"
  done
  echo "# assumed on the GPU machine: ${assumed[*]}"
} > MANIFEST

total="$(du -cb ./*.deb MANIFEST | tail -n 1 | cut -f1)"
total_mib="$(awk -v b="$total" 'BEGIN { printf "%.1f", b / 1048576 }')"
if [ "$total" -gt $((max_mib * 1048576)) ]; then
  echo "prepare_prefix: $debs holds $total_mib MiB, over the $max_mib MiB allowed" >&2
  exit 1
fi
echo "prepare_prefix: $(ls ./*.deb | wc -l) packages, $total_mib MiB ($total bytes) in $debs"
