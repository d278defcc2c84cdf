#!/usr/bin/env bash
# Sets up, builds, and runs the whole test suite through CTest.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
scripts/setup.sh
ctest --preset default
