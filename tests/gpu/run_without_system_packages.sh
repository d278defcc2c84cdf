#!/usr/bin/env bash
# Runs tests/gpu/run_gpu_checks.sh here the way the lent GPU machine sees
# multidev's dependencies: not at all, but for tests/gpu/debs. In a private
# mount namespace (unshare -m; root), it hides what this machine's own Debian
# packages of them installed: the header folders (caf, boost, fmt, CLI,
# nlohmann, and oneTBB's and StarPU's) and the CMake and pkg-config folders
# under an empty tmpfs, and every library file of the carried packages (and
# of oneTBB and StarPU) under /dev/null, so that a build or a program that
# still reached for one fails. libssl3 stays (this machine's cmake needs
# it); the programs load the prefix's, which LD_LIBRARY_PATH puts first.
# Arguments go to run_gpu_checks.sh; so does the environment
# (MULTIDEV_GPU_PREFIX, MULTIDEV_GPU_BUILD_DIR, ...).
#
# Usage: tests/gpu/run_without_system_packages.sh [run_gpu_checks.sh's arguments]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [ -z "${MULTIDEV_IN_PRIVATE_MOUNTS:-}" ]; then
  exec env MULTIDEV_IN_PRIVATE_MOUNTS=1 unshare -m --propagation private bash "$0" "$@"
fi

multiarch="$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo x86_64-linux-gnu)"
for d in /usr/include/caf /usr/include/boost /usr/include/fmt /usr/include/CLI \
         /usr/include/nlohmann /usr/include/tbb /usr/include/oneapi /usr/include/starpu \
         "/usr/lib/$multiarch/cmake" /usr/lib/cmake /usr/share/cmake \
         "/usr/lib/$multiarch/pkgconfig" /usr/share/pkgconfig; do
  [ -d "$d" ] && mount -t tmpfs -o ro,size=1m hidden "$d"
done
packages="$(grep -v '^#' "$here/debs/MANIFEST" | cut -d' ' -f1 | grep -v '^libssl3$')"
packages+=" libtbb-dev libtbb12 libtbbmalloc2 libtbbbind-2-5 libstarpu-dev libstarpu-1.3-9"
hidden=0
for p in $packages; do
  dpkg-query -W "$p" >/dev/null 2>&1 || continue
  while read -r f; do
    case "$f" in /usr/lib/*.so|/usr/lib/*.so.*|/usr/lib/*.a) ;; *) continue ;; esac
    [ -e "$f" ] || continue
    mount --bind /dev/null "$f"
    hidden=$((hidden + 1))
  done < <(dpkg -L "$p")
done
echo "run_without_system_packages: hid $hidden library files and the header, CMake and" \
     "pkg-config folders of: $(echo $packages | tr '\n' ' ')"
echo "run_without_system_packages: /usr/include/caf now holds $(ls -A /usr/include/caf | wc -l) entries;" \
     "/usr/lib/$multiarch/libcaf_core.so.0.17.6 is $(stat -L -c %s "/usr/lib/$multiarch/libcaf_core.so.0.17.6" 2>/dev/null || echo absent) bytes"
exec bash "$here/run_gpu_checks.sh" "$@"
