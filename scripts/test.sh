#!/usr/bin/env bash
# Installs what is missing, builds, and runs the tests: every CPU test, the GPU tests (which
# skip, saying why, where there is no GPU), then the CPU tests again under AddressSanitizer and
# UndefinedBehaviorSanitizer (skip that with ASYNCTP_SKIP_ASAN=1).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
bash scripts/deps.sh
bash scripts/build.sh
jobs=$(nproc)
echo "== tests (build/)"
ctest --test-dir build --output-on-failure -j "$jobs" --timeout 600
echo "== build and main tests took $(( $(date +%s) - start )) s"
if [ "${ASYNCTP_SKIP_ASAN:-0}" != "1" ]; then
  echo "== CPU tests under AddressSanitizer (build-asan/)"
  cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DASYNCTP_SANITIZE=ON \
        -DASYNCTP_WITH_CUDA=OFF >/dev/null
  cmake --build build-asan
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --test-dir build-asan -L cpu --output-on-failure -j "$jobs" --timeout 900
fi
echo "== all tests passed in $(( $(date +%s) - start )) s"
