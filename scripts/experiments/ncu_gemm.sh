#!/usr/bin/env bash
# Nsight Compute counters of the native GEMM beside cuBLASLt's kernel, on one GPU (by hand, on a
# GPU machine; builds nothing). Why: the native kernel alone runs 1-4% behind our tuned cuBLASLt
# GEMM on the anchor shapes, and timing variants (sessions 7-12) did not say where the time goes.
#
#   BIN=.carry bash scripts/experiments/ncu_gemm.sh 8192x4096x14336 [MxKxN ...]
#
# For each shape: `asynctp bench ag-mm --shape S` on one rank under ncu (every section, clocks
# left alone), profiling only the bf16 GEMM kernels (ours and cuBLAS's: nvjet / xmma / cutlass;
# cuBLASLt's first heuristic, ASYNCTP_GEMM_AUTOTUNE=0, so that tuning candidates are not
# profiled). Writes $OUT/ncu_S.ncu-rep and its raw CSV, and prints the metrics that say where a
# GEMM's time goes, one column per kernel. SOURCE=1 also exports each kernel's SASS with its
# per-instruction counts and stall samples ($OUT/ncu_S.sass.csv).
set -uo pipefail
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/asynctp-ncu}
BIN=${BIN:-build/bin}
mkdir -p "$OUT"
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -n "$NCU" ] || { echo "ncu not found"; exit 1; }
py_lib() { python3 -c "import importlib, os; m = importlib.import_module('$1'); print(os.path.join(list(m.__path__)[0], 'lib'))" 2>/dev/null; }
ldd "$BIN/asynctp" | grep -q "libnccl.so.2 => /" || export LD_LIBRARY_PATH="$(py_lib nvidia.nccl):${LD_LIBRARY_PATH:-}"
ldd "$BIN/asynctp" | grep -q "libcublasLt.so.13 => /" || export LD_LIBRARY_PATH="$(py_lib nvidia.cublas):${LD_LIBRARY_PATH:-}"

for shape in "$@"; do
  rep="$OUT/ncu_$shape"
  echo "== ncu: $shape"
  ASYNCTP_GEMM_AUTOTUNE=0 "$NCU" --clock-control none --set full --target-processes all \
    --kernel-name regex:'async_gemm_kernel|nvjet|xmma|cutlass' --launch-count "${NCU_COUNT:-6}" \
    -o "$rep" -f "$BIN/asynctp" bench ag-mm --backend cuda --shape "$shape" --iters 1 --warmup 1 \
    --no-graph > "$rep.log" 2>&1 || { tail -20 "$rep.log"; continue; }
  "$NCU" --import "$rep.ncu-rep" --page raw --csv > "$rep.csv" 2> "$rep.err"
  if [ "${SOURCE:-0}" = 1 ]; then
    # Per-instruction SASS with its executed count and stall samples, for every profiled kernel.
    "$NCU" --import "$rep.ncu-rep" --page source --csv --print-source sass > "$rep.sass.csv" 2>> "$rep.err"
  fi
  python3 - "$rep.csv" <<'PY'
import csv, re, sys
rows = list(csv.reader(open(sys.argv[1])))
head, units, data = rows[0], rows[1], rows[2:]
col = {h: i for i, h in enumerate(head)}
def short(name):
    return ("ours" if "async_gemm" in name else name[:40])
names = [short(r[col["Kernel Name"]]) for r in data]
# Keep only the bf16 kernels (the reference's f32 GEMM is profiled too when it matches).
keep = [i for i, r in enumerate(data) if "f32f32" not in r[col["Kernel Name"]]]
print("kernels:", *[data[i][col["Kernel Name"]][:160] for i in keep], sep="\n  ")
pats = [r"^gpu__time_duration\.sum$", r"^sm__cycles_elapsed\.avg\.per_second$",
        r"^launch__(grid_size|block_size|cluster_dim_[xyz]|registers_per_thread|shared_mem_per_block_dynamic)$",
        r"^sm__throughput\.avg\.pct_of_peak_sustained_elapsed$",
        r"tensor.*pct_of_peak_sustained_(active|elapsed)$", r"gmma.*pct", r"^sm__inst_executed_pipe_.*gmma",
        r"^lts__t_sector_hit_rate\.pct$", r"^lts__t_bytes\.sum$", r"^dram__bytes_(read|write)\.sum$",
        r"^l1tex__data_pipe_lsu_wavefronts_mem_shared.*sum$", r"^lts__throughput\.avg\.pct_of_peak_sustained_elapsed$",
        r"^dram__throughput\.avg\.pct_of_peak_sustained_elapsed$",
        r"^smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio$",
        r"^smsp__cycles_active\.avg$", r"^sm__warps_active\.avg\.pct_of_peak_sustained_active$",
        r"^smsp__inst_executed\.sum$"]
for h in head:
    if not any(re.search(p, h) for p in pats): continue
    vals = [data[i][col[h]] for i in keep]
    try:
        if all(float(v.replace(",", "")) == 0 for v in vals): continue
    except ValueError:
        pass
    print(f"{h[:78]:78} {units[col[h]][:8]:8} " + " ".join(f"{v[:14]:>14}" for v in vals))
PY
done
