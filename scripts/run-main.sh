#!/usr/bin/env bash
# Sets up, builds, and runs the main job on the default embedded setup (local
# CPU devices, no server to start): the quickstart scenario, whose report
# says whether every expectation held (exit status 0) or not.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
scripts/setup.sh multidev_tool
build/bin/multidev run examples/scenarios/quickstart.scn
