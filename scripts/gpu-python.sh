#!/usr/bin/env bash
# Runs on the GPU machine; builds nothing. torch.ops.asynctp from a torchrun script
# (tests/python/run_gpu.py: the op checks on CUDA, a CUDA-graph capture and replay, timings
# against torch.ops.symm_mem on the anchor shapes, host time per eager call), then
# `asynctp bench --suite anchors` on the same shapes, paced and sustained, so that the op timed
# from torch and the op timed by the C++ bench can be compared in one call; then the host time of
# one eager call split into the library's phases and Python's part (python -m asynctp.bench.host,
# run_gpu.py's host_us calls). Logs under $OUT.
#
#   LIB=path/to/libasynctp_c.so   (default: build/lib/libasynctp_c.so)
#   BIN=dir-with-asynctp          (default: build/bin)
#   NGPU=2                        (default: every visible GPU)
#   STEPS="torch bench host"      (default: all three)
#   ITERS=30                      (timed runs per measurement)
#   HIDE_LAUNCH=0                 (device cycles each timed run starts behind its barrier, in
#                                  run_gpu.py and the bench alike: the host's enqueueing then
#                                  falls in that delay and both time the device alone; 0: off)
set -uo pipefail
cd "$(dirname "$0")/.."
# NVLink multicast off in every library of the run (asynctp itself never uses it).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/asynctp-gpu-python}
mkdir -p "$OUT"
LIB=${LIB:-build/lib/libasynctp_c.so}
BIN=${BIN:-build/bin}
NGPU=${NGPU:-$(nvidia-smi -L | wc -l)}
STEPS=${STEPS:-torch bench host}
ITERS=${ITERS:-30}
HIDE_LAUNCH=${HIDE_LAUNCH:-0}
export ASYNCTP_LIBRARY=$PWD/$LIB PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
export ASYNCTP_CACHE_DIR=${ASYNCTP_CACHE_DIR:-$OUT/cache} PYTHONUNBUFFERED=1
status=0
step() { case " $STEPS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

# The library and the binary link NCCL and cuBLASLt dynamically: the system's, else PyTorch's
# (inside a torch process the one torch loaded serves both).
py_lib() { python3 -c "import importlib, os; m = importlib.import_module('$1'); print(os.path.join(list(m.__path__)[0], 'lib'))" 2>/dev/null; }
for pair in "libnccl.so.2 nvidia.nccl" "libcublasLt.so.13 nvidia.cublas"; do
  set -- $pair
  if ! ldd "$LIB" | grep -q "$1 => /"; then
    export LD_LIBRARY_PATH="$(py_lib "$2"):${LD_LIBRARY_PATH:-}"
  fi
done

if step torch; then
  echo "== torch.ops.asynctp on $NGPU GPUs (tests/python/run_gpu.py)"
  torchrun --nproc-per-node "$NGPU" tests/python/run_gpu.py --iters "$ITERS" --hide-launch "$HIDE_LAUNCH" \
    > "$OUT/run_gpu.log" 2>&1 || { status=1; echo "run_gpu.py failed"; }
  grep -E '"kind": "(env|capture|ag_mm|mm_rs|host_us|done)"' "$OUT/run_gpu.log" | head -40
  grep -E "FAIL|Error|Traceback" "$OUT/run_gpu.log" | head -20
fi

if step bench; then
  for pace in paced sustained; do
    args=(--suite anchors --iters "$ITERS" --warmup-ms 300 --hide-launch "$HIDE_LAUNCH")
    [ "$pace" = sustained ] && args+=(--pace 0)
    echo "== asynctp bench ${args[*]} ($pace)"
    "$BIN/asynctp" launch --nproc "$NGPU" -- "$BIN/asynctp" bench "${args[@]}" \
      > "$OUT/bench-$pace.log" 2>&1 || { status=1; echo "bench ($pace) failed"; }
    grep -vE '^\[rank [1-9]' "$OUT/bench-$pace.log" | tail -30
  done
fi
if step host; then
  echo "== host time of one eager call, by phase (python -m asynctp.bench.host)"
  torchrun --nproc-per-node "$NGPU" -m asynctp.bench.host --json "$OUT/host.json" \
    > "$OUT/host.log" 2>&1 || { status=1; echo "asynctp.bench.host failed"; }
  grep -vE '^\[rank [1-9]' "$OUT/host.log" | tail -80
fi
exit $status
