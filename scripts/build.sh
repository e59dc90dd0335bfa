#!/usr/bin/env bash
# Configures and builds into build/ (Release; the CUDA backend when nvcc is found).
# Extra arguments go to cmake's configure step, e.g. -DASYNCTP_WITH_CUDA=OFF.
set -euo pipefail
cd "$(dirname "$0")/.."
# `pip install . -Cbuild-dir=build` (scripts/test.sh) configures this same tree for the wheel and
# leaves its settings in the cache (SKBUILD*, and CMAKE_PREFIX_PATH and CMAKE_MODULE_PATH into
# site-packages); they are dropped here, so that build/ is the plain build again (with every
# install rule), whatever ran last. That changes no compile flag: nothing is recompiled.
cmake -S . -B build -G Ninja -U 'SKBUILD*' -U CMAKE_PREFIX_PATH -U CMAKE_MODULE_PATH \
      -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build build
