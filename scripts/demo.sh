#!/usr/bin/env bash
# The main job: installs what is missing, builds, and runs the sequence-parallel MLP demo on 4
# ranks (on the GPUs when there are any, else on the CPU backend).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
bash scripts/build.sh
exec build/bin/asynctp launch --nproc "${NPROC:-4}" -- build/bin/asynctp demo "$@"
