#!/usr/bin/env bash
# Builds and runs the whole test suite, every test on every CPU target this machine runs (in one
# process; the worker threads also under TSan; the installed package through a find_package
# consumer), optimised, then under ASan + UBSan on the portable target; then builds the Python
# wheel, installs it into the environment of setup.sh and runs the Python tests (tests/python)
# against the float64 oracles' module built beside it (not part of the wheel).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bash "$root/scripts/setup.sh"
jobs="$(nproc)"

echo "== Release build and tests"
bash "$root/scripts/build.sh" "$root/build-test" -DCMAKE_BUILD_TYPE=Release
ctest --test-dir "$root/build-test" --output-on-failure -j "$jobs"

# AddressSanitizer does not see the loads and stores of intrinsics, so a workspace overrun in a
# product shows on the portable target, where every access is instrumented (and the workspace
# arena poisons the gaps between its arrays, src/cpu/arena.h); every test runs it. The sanitized
# build has no other target (CMakeLists.txt: their stages are the portable target's source,
# checked there; the tile kernel stays under the sanitizers in the microkernel tests, which
# instantiate it on the model in their own unit).
# Line tables (-g1) are all the sanitizers' reports need; full variable locations make gcc track
# every variable of the unrolled convolution rows and retry without (the generic target alone took
# 649 s to compile with -g, 332 s with -g1, on an EPYC Zen 4 core).
echo "== ASan + UBSan build and tests"
bash "$root/scripts/build.sh" "$root/build-sanitize" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG" -DFLAT_SANITIZE=ON
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir "$root/build-sanitize" --output-on-failure -j "$jobs"

echo "== Python wheel and tests"
python="$(bash "$root/scripts/python.sh" -C cmake.define.FLAT_ORACLE=ON)"
(cd "$root/tests/python" && "$python" -m pytest -q -p no:cacheprovider)
