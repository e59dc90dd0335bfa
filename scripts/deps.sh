#!/usr/bin/env bash
# Installs what the build and the tests need, where it is missing: the Debian packages (root or
# sudo for those), then the Python packages, with pip, into the interpreter $PYTHON (python3 by
# default): torch (the tests run it on the CPU), pytest and numpy, and scikit-build-core, the
# wheel's build backend (the wheel is built without build isolation, so that it reuses build/).
# Whatever is already installed at a suitable version is left as it is.
set -euo pipefail
# clang-14 and its runtime libraries (libFuzzer, the sanitizers; only recommended by clang-14)
# build the fuzz targets of tests/fuzz.
packages=(cmake ninja-build g++ pkg-config libgtest-dev libgmock-dev libbenchmark-dev
          libcli11-dev nlohmann-json3-dev libfmt-dev libspdlog-dev clang-14 libclang-rt-14-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "deps: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Python: "distribution minimum-version" per line; the distribution's installed version must be
# at least the minimum (numeric major.minor.patch comparison).
python=${PYTHON:-python3}
python_missing=$("$python" - <<'EOF'
import importlib.metadata as md
import re

WANTED = [("torch", "2.11"), ("pytest", "7.0"), ("numpy", "1.24"), ("scikit-build-core", "0.10")]


def numeric(version):
    return tuple(int(part) for part in re.findall(r"\d+", version.split("+")[0])[:3])


for name, minimum in WANTED:
    try:
        installed = md.version(name)
    except md.PackageNotFoundError:
        installed = None
    if installed is None or numeric(installed) < numeric(minimum):
        print(f"{name}>={minimum}")
EOF
)
if [ -n "$python_missing" ]; then
  mapfile -t requirements <<<"$python_missing"
  echo "deps: pip installing ${requirements[*]}"
  "$python" -m pip install --quiet --disable-pip-version-check "${requirements[@]}"
fi
