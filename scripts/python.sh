#!/usr/bin/env bash
# Builds the Python wheel (pip wheel) into the environment of setup.sh and installs it:
# scripts/python.sh prints the environment's python. Arguments go to pip wheel (scripts/test.sh:
# -C cmake.define.FLAT_ORACLE=ON, the tests' oracle module beside the wheel, in build-python/).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="${FLAT_VENV:-$HOME/.cache/flat-venv}"
wheels="$root/build-python/wheels"
rm -rf "$wheels"
"$venv/bin/python" -m pip wheel -q --no-build-isolation --no-deps "$root" -w "$wheels" "$@" >&2
"$venv/bin/python" -m pip install -q --force-reinstall --no-deps "$wheels"/flat_attention-*.whl >&2
echo "$venv/bin/python"
