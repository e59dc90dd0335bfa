#!/usr/bin/env bash
# Configures and builds into build/ (Release; the CUDA backend when nvcc is found).
# Extra arguments go to cmake's configure step, e.g. -DASYNCTP_WITH_CUDA=OFF.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build build
