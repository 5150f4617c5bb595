#!/usr/bin/env bash
# Installs what flat needs to build, test and benchmark, where it is missing: the Debian packages,
# and a Python virtual environment created once and reused ($FLAT_VENV, by default
# ~/.cache/flat-venv) with torch, jax, the package's build tools, flat.train's needs (tqdm,
# safetensors, matplotlib), flat.transformers' (transformers) and flat.fla's (FLA 0.6, without its
# dependencies, and einops). Prints nothing when all is there.
set -euo pipefail
packages=(cmake ninja-build g++ make libgtest-dev)
# Debian's python3 needs its venv module and headers; another python3 (pyenv's, say) has them.
if ! command -v python3 > /dev/null || [ "$(command -v python3)" = /usr/bin/python3 ]; then
  packages+=(python3 python3-venv python3-dev)
fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq "${missing[@]}"
fi

venv="${FLAT_VENV:-$HOME/.cache/flat-venv}"
# flat.transformers takes transformers 5.24 and 5.25 (docs/transformers.md); the suite runs the newer.
transformers_series=5.25
python_packages=(torch jax numpy pytest nanobind scikit-build-core tqdm safetensors matplotlib
                 "transformers==${transformers_series}.*")
if [ ! -x "$venv/bin/python" ]; then
  echo "setup: creating the Python environment $venv"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
fi
if ! "$venv/bin/python" -c "import torch, jax, numpy, pytest, nanobind, scikit_build_core, tqdm, safetensors, matplotlib, transformers
assert transformers.__version__.startswith('${transformers_series}.')" 2> /dev/null; then
  echo "setup: installing ${python_packages[*]} into $venv (torch brings about 3.5 GB, once)"
  "$venv/bin/python" -m pip install -q "${python_packages[@]}"
fi
# flat.fla is FLA's CPU backend (tests/python/test_fla_backend.py): FLA 0.6 without its dependencies
# (they would pull another torch and Triton builds), with einops, the one FLA imports on a CPU.
fla_version=0.6.0
if ! "$venv/bin/python" -c "import einops, importlib.metadata as m
assert m.version('flash-linear-attention') == m.version('fla-core') == '${fla_version}'" 2> /dev/null; then
  echo "setup: installing flash-linear-attention ${fla_version} (--no-deps) and einops into $venv"
  "$venv/bin/python" -m pip install -q --no-deps "flash-linear-attention==${fla_version}" "fla-core==${fla_version}" einops
fi
