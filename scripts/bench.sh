#!/usr/bin/env bash
# The main job: builds flat and runs `flat bench` (default shapes unless arguments are given).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bash "$root/scripts/setup.sh"
bash "$root/scripts/build.sh" "$root/build" -DCMAKE_BUILD_TYPE=Release -DFLAT_TESTS=OFF
"$root/build/flat" bench "$@"
