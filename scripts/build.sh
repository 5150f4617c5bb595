#!/usr/bin/env bash
# Configures and builds one flavour of flat: scripts/build.sh DIR [cmake options...]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dir="$1"
shift
# Ninja compiles a target's sources while the libraries it links are still compiling, where Make
# builds each target after the last: the sanitized build's portable target alone compiles for about
# five minutes, which the tools' and tests' units now share with it. A folder made before keeps its
# generator.
generator=()
[ -f "$dir/CMakeCache.txt" ] || generator=(-G Ninja)
cmake -S "$root" -B "$dir" "${generator[@]}" "$@" > /dev/null
cmake --build "$dir" -j "$(nproc)"
