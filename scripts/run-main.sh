#!/usr/bin/env bash
# Sets up, builds, and runs the main job on the default embedded setup (local
# CPU devices, no server to start): the quickstart scenario, whose report
# says whether every expectation held (exit status 0) or not. Installs and
# builds only what that needs: the tool, without the test suite and the
# packages only the tests and the bench use (MULTIDEV_SETUP=main).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
MULTIDEV_SETUP=main scripts/setup.sh multidev_tool
build/bin/multidev run examples/scenarios/quickstart.scn
