#!/usr/bin/env bash
# Builds and runs the whole test suite: optimised (on the CPU's best code path, on the portable one
# and on the bf16 dot-product one where the CPU has it; the worker threads also under TSan), then
# under ASan + UBSan (on the best and the portable code paths).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bash "$root/scripts/setup.sh"
jobs="$(nproc)"

echo "== Release build and tests"
bash "$root/scripts/build.sh" "$root/build-test" -DCMAKE_BUILD_TYPE=Release
ctest --test-dir "$root/build-test" --output-on-failure -j "$jobs"

# The sanitized suite runs on the CPU's best code path and on the portable one: AddressSanitizer
# does not see the loads and stores of AVX-512 intrinsics, so a workspace overrun in a product
# shows only on the portable path, where every access is instrumented (and the workspace arena
# poisons the gaps between its arrays, src/cpu/arena.h).
echo "== ASan + UBSan build and tests"
bash "$root/scripts/build.sh" "$root/build-sanitize" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFLAT_SANITIZE=ON \
  -DFLAT_TEST_PORTABLE=ON -DFLAT_TEST_BF16_DOT=OFF
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir "$root/build-sanitize" --output-on-failure -j "$jobs"
