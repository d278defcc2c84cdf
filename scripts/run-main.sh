#!/usr/bin/env bash
# Sets up, builds, and runs the main job on the default embedded setup: the
# device list, the first program, and the 4-device gradient merge.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
scripts/setup.sh multidev_tool example_first example_gradient_merge
build/bin/multidev devices
build/bin/example_first
build/bin/example_gradient_merge
