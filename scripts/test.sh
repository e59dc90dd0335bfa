#!/usr/bin/env bash
# Installs what is missing, builds, and runs the tests: every CPU test and the GPU tests (which
# skip, saying why, where there is no GPU) in build/; then the Python package, built by pip from
# that same build/ (nothing is compiled twice), and its tests (torch on the CPU, gloo); then the
# CPU tests again under AddressSanitizer and UndefinedBehaviorSanitizer in build-asan/ (skip that
# with ASYNCTP_SKIP_ASAN=1); then the fuzz targets (clang, build-fuzz/). Prints each stage's time,
# and all of them at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
# Twice as many ctest jobs as cores: most tests wait on their rank processes, sleeps and
# timeouts rather than compute (the 469 tests of build/ take 87 s one after another, 11 s of it
# CPU time). On 2 cores under a load of 20, ctest -j 2 took 37-44 s, -j 4 21-23 s, -j 8 15 s;
# build-asan/'s CPU tests take 205 s in sequence and took 52 s at -j 4 (load 8-11).
jobs=$((2 * $(nproc)))
start=$(date +%s)
times=()

# stage NAME COMMAND...: runs the command, prints and records how long it took.
stage() {
  local name=$1
  shift
  local t0
  t0=$(date +%s)
  echo "== $name"
  "$@"
  local took=$(($(date +%s) - t0))
  echo "== $name took $took s"
  times+=("$(printf '%-12s %5d s' "$name" "$took")")
}

# pytest exits 5 when it collected no test: that fails the run like any other non-zero exit.
python_tests() {
  local rc=0
  "$python" -m pytest tests/python -q -p no:cacheprovider || rc=$?
  if [ "$rc" -eq 5 ]; then
    echo "test.sh: pytest collected no test in tests/python" >&2
  fi
  return "$rc"
}

stage deps bash scripts/deps.sh
stage build bash scripts/build.sh
stage ctest ctest --test-dir build --output-on-failure -j "$jobs" --timeout 600
# The wheel reuses build/ (the same configuration as scripts/build.sh: Release, tests on), so
# it compiles nothing that the build stage compiled; ASYNCTP_BUILD_TESTS=ON keeps the tests in
# build/'s cache, which the wheel's own default would turn off.
wheel() {
  local marker
  marker=$(mktemp)
  ASYNCTP_BUILD_TESTS=ON "$python" -m pip install . --no-build-isolation --no-deps --quiet \
    --disable-pip-version-check -Cbuild-dir=build
  local recompiled
  recompiled=$(find build -name '*.o' -newer "$marker" | head -5)
  rm -f "$marker"
  if [ -n "$recompiled" ]; then
    echo "test.sh: building the wheel recompiled objects of build/, e.g.:" >&2
    echo "$recompiled" >&2
    return 1
  fi
}
stage wheel wheel
stage pytest python_tests
if [ "${ASYNCTP_SKIP_ASAN:-0}" != "1" ]; then
  # ASYNCTP_SANITIZE compiles at -O1 with line tables (see CMakeLists.txt).
  stage asan-build bash -c "cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DASYNCTP_SANITIZE=ON -DASYNCTP_WITH_CUDA=OFF >/dev/null && cmake --build build-asan"
  stage asan-ctest env ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
    UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --test-dir build-asan -L cpu --output-on-failure -j "$jobs" --timeout 900
fi
# The libFuzzer targets of tests/fuzz (clang, ASan and UBSan; their own build dir, which builds
# only the targets and the libraries they link): each runs its corpus, then 50,000 mutations of
# it from a fixed seed (tests/fuzz/CMakeLists.txt). On this machine's 2 cores, shared (load
# 9-15), without ccache, the stage took 5 min 43 s: the build (core, the graph reader, the
# target) 5 min 20 s, graph_reader's runs 22 s (about 2,500 executions a second).
fuzz() {
  cmake -S . -B build-fuzz -G Ninja -DCMAKE_CXX_COMPILER=clang++-14 -DASYNCTP_FUZZ=ON \
    -DASYNCTP_BUILD_TESTS=OFF -DASYNCTP_WITH_CUDA=OFF >/dev/null
  cmake --build build-fuzz --target asynctp_fuzz_targets
  ctest --test-dir build-fuzz -L fuzz --output-on-failure --timeout 1200
}
stage fuzz fuzz
echo "== stage times"
printf '%s\n' "${times[@]}"
echo "== all tests passed in $(($(date +%s) - start)) s"
