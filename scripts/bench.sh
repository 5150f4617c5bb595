#!/usr/bin/env bash
# The main job: builds flat and runs `flat bench` (default shapes unless arguments are given), then
# the Python benchmark (python -m flat.bench: the binding's overhead, flat.torch against plain
# PyTorch).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bash "$root/scripts/setup.sh"
bash "$root/scripts/build.sh" "$root/build" -DCMAKE_BUILD_TYPE=Release -DFLAT_TESTS=OFF
"$root/build/flat" bench "$@"
python="$(bash "$root/scripts/python.sh")"
(cd "$root/build-python" && "$python" -m flat.bench)
