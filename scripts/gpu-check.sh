#!/usr/bin/env bash
# Runs on the GPU machine; builds nothing. Runs the GPU tests, the benchmarks and PyTorch's anchor
# script side by side, and writes every log and JSON under $OUT.
#
#   BIN=dir-with-asynctp-and-test-binaries  (default: build/bin)
#   NGPU=4                                  (default: every visible GPU)
#   STEPS="env tests shared sanitize bench demo torch"  (default: all but shared, in that order)
#   SHARED=4                                (shared: how many ranks per GPU; default 4 / NGPU)
#   TORCH_BENCH=path/to/torch_asynctp_bench.py (the anchor script; default .carry/torch_asynctp_bench.py)
#   GTEST_FILTER=...                        (passed to the GPU test binary)
#   SANITIZE_BINARIES / SANITIZE_TOOLS / SANITIZE_FILTER / SANITIZE_SHARDS / SANITIZE_TIMEOUT /
#   SANITIZE_LIMIT                          (sanitize: which binaries, tools, tests; how many
#                                            gtest shards the tests are cut into (default 6;
#                                            SANITIZE_JOBS of them at once); the
#                                            ASYNCTP_TIMEOUT of the run, default 120 s; the
#                                            limit of one run, default 600 s)
#   SANITIZE_JOBS=2                         (sanitize: how many shards run at once; default all,
#                                            racecheck one per 96 GiB of available memory)
#   SANITIZE_ARGS="--show-backtrace no"     (sanitize: more options for compute-sanitizer)
#   SANITIZE_SHARD_INDICES="0 1 ... 15"     (sanitize: which of the SANITIZE_SHARDS shards this run
#                                            takes, default all: a binary too slow
#                                            for one call goes in several, e.g. shards 0-15 of
#                                            32, then 16-31; gtest refuses an index out of range)
#   BENCH_ARGS="--pace 0 ..."               (more options for asynctp bench)
#   BUNDLE=1                                (write the logs elsewhere and leave in $OUT only one
#                                            archive of them, gpu-check.tgz, and the summaries
#                                            bench.txt and torch.txt, for a transport that brings
#                                            back only a few files)
set -uo pipefail
cd "$(dirname "$0")/.."
# NVLink multicast off in every library of the run (asynctp itself never uses it).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/asynctp-gpu-check}
mkdir -p "$OUT"
if [ "${BUNDLE:-0}" = 1 ]; then
  FINAL=$OUT
  OUT=$(mktemp -d /tmp/asynctp-gpu-check.XXXXXX)
  bundle() {
    tar czf "$FINAL/gpu-check.tgz" -C "$OUT" .
    for f in bench.txt torch.txt; do [ -f "$OUT/$f" ] && cp "$OUT/$f" "$FINAL/"; done
    echo "== logs: $FINAL/gpu-check.tgz"
  }
  trap bundle EXIT
fi
BIN=${BIN:-build/bin}
NGPU=${NGPU:-$(nvidia-smi -L | wc -l)}
STEPS=${STEPS:-env tests sanitize bench demo torch}
SHARED=${SHARED:-$(( (4 + NGPU - 1) / NGPU ))}
TORCH_BENCH=${TORCH_BENCH:-.carry/torch_asynctp_bench.py}
status=0

# Libraries the binaries link dynamically: the system's, else the ones PyTorch ships.
py_lib() { python3 -c "import importlib, os; m = importlib.import_module('$1'); print(os.path.join(list(m.__path__)[0], 'lib'))" 2>/dev/null; }
if ! ldd "$BIN/asynctp" | grep -q "libnccl.so.2 => /"; then
  export LD_LIBRARY_PATH="$(py_lib nvidia.nccl):${LD_LIBRARY_PATH:-}"
fi
if ! ldd "$BIN/asynctp" | grep -q "libcublasLt.so.13 => /"; then
  export LD_LIBRARY_PATH="$(py_lib nvidia.cublas):${LD_LIBRARY_PATH:-}"
fi

step() { case " $STEPS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

# SM clocks, power and temperature every 200 ms while the benchmarks run (clocks.csv): timings of
# two runs, or of ours and PyTorch's, compare only at the same clocks.
sample_clocks() {
  nvidia-smi --query-gpu=timestamp,index,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active \
    --format=csv,noheader -lms 200 >> "$OUT/clocks.csv" 2>/dev/null &
  SAMPLER=$!
}
stop_clocks() { kill "$SAMPLER" 2>/dev/null; wait "$SAMPLER" 2>/dev/null; }
summarize_clocks() {  # $1: label; the samples from line $2 of clocks.csv on
  python3 - "$OUT/clocks.csv" "$2" "$1" <<'PY'
import statistics, sys
rows = [l.split(", ") for l in open(sys.argv[1]).read().splitlines()[int(sys.argv[2]) - 1:]]
mhz = [float(r[2].split()[0]) for r in rows if len(r) > 4]
watts = [float(r[3].split()[0]) for r in rows if len(r) > 4]
if mhz:
    print(f"== clocks during {sys.argv[3]}: SM MHz median {statistics.median(mhz):.0f} "
          f"(min {min(mhz):.0f}), mean power {statistics.mean(watts):.0f} W, {len(mhz)} samples")
PY
}

if step env; then
  { date; nvidia-smi; nvidia-smi topo -m; ldd "$BIN/asynctp"; } > "$OUT/env.txt" 2>&1
  echo "== $NGPU GPUs: $(nvidia-smi --query-gpu=name --format=csv,noheader | sort | uniq -c)"
fi

# The dispatcher's measured choices go to a fresh cache of this run (and come back with the logs).
export ASYNCTP_CACHE_DIR=${ASYNCTP_CACHE_DIR:-$OUT/cache}

if step tests; then
  for t in test_device_gpu test_ops_gpu; do
    [ -x "$BIN/$t" ] || continue
    echo "== GPU tests: $t"
    "$BIN/$t" --gtest_brief=1 ${GTEST_FILTER:+--gtest_filter=$GTEST_FILTER} > "$OUT/$t.log" 2>&1
    rc=$?
    grep -E "^\[  (PASSED|FAILED|SKIPPED) |tests ran|FAILED  \]" "$OUT/$t.log" | tail -25
    [ $rc -eq 0 ] || status=1
  done
fi

if step shared; then
  # The multi-rank op tests with SHARED ranks on each GPU (ASYNCTP_SHARED_GPUS; correctness
  # only: the ranks share the SMs). On fewer GPUs than ranks, this is what runs ws 2 and 4.
  echo "== GPU tests, $SHARED ranks per GPU: test_ops_gpu"
  ASYNCTP_SHARED_GPUS=$SHARED "$BIN/test_ops_gpu" --gtest_brief=1 ${GTEST_FILTER:+--gtest_filter=$GTEST_FILTER} \
    > "$OUT/test_ops_gpu_shared.log" 2>&1
  rc=$?
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |tests ran|FAILED  \]" "$OUT/test_ops_gpu_shared.log" | tail -25
  [ $rc -eq 0 ] || status=1
  # And the bench's validation of every anchor shape (each path against the f32 reference, the
  # reduce-scatters bit for bit) at ws SHARED * NGPU; its timings mean nothing here.
  ranks=$(( SHARED * NGPU ))
  echo "== asynctp bench --suite anchors, validation only ($ranks ranks, $SHARED per GPU)"
  ASYNCTP_SHARED_GPUS=$SHARED "$BIN/asynctp" launch --nproc "$ranks" --timeout 500 -- \
    "$BIN/asynctp" bench --suite anchors --iters 1 --warmup 0 --no-graph --pace 0 \
    > "$OUT/bench_shared.txt" 2>&1
  rc=$?
  echo "rc $rc: $(grep -cE '^\[rank 0\] (ag-mm|mm-rs) ' "$OUT/bench_shared.txt") shapes validated"
  grep -iE "error|wrong" "$OUT/bench_shared.txt" | head -5
  [ $rc -eq 0 ] || status=1
fi

if step sanitize; then
  # Every GPU test binary under compute-sanitizer's four tools: memcheck with the leak check,
  # racecheck, synccheck and initcheck; the rank processes the op tests fork are followed. The
  # sanitizers slow kernels down, so every wait is lengthened through ASYNCTP_TIMEOUT (the
  # tests' waits that are meant to succeed take their bound from it). API errors are not
  # reported: NCCL's set-up probes kernels that its build lacks for this GPU, and our own calls'
  # statuses are all checked (ASYNCTP_CUDA_CHECK). racecheck skips the tests that compare with
  # cuBLASLt (the tool itself fails on those kernels: "Internal Sanitizer Error"), and the float8
  # tests whose cuBLASLt kernels it reports hazards in (float8 nvjet_sm90_qq*, and the larger
  # bf16 tiles nvjet_sm90_ts*: the fast-accumulation test, the random op sequences, the
  # dispatcher's timing of every path, the layer-shaped SwiGLU case): NVIDIA's code, and leaving
  # those kernels out instead (--kernel-name-exclude) makes the tool fail on every test that runs
  # them ("failed to handle a hardware exception"). It also skips the native reduce-scatter on
  # several streams: under racecheck each rank process grows by about 1 GiB of host memory a
  # second whatever it runs, and that test's ranks live long enough (over 150 s) for the OOM
  # killer; the same kernels run in the shorter native reduce-scatter tests. initcheck runs
  # kernels one at a time, so it skips the tests whose kernel waits for work enqueued after it on
  # another stream (they could only time out there); the other tools run them. racecheck and
  # synccheck leave NCCL's kernels out: synccheck flags the divergent named barriers NCCL's
  # reduce-scatter uses on purpose. Each run:
  # sanitize_<binary>_<tool>.log, and its ERROR SUMMARY / LEAK lines here.
  CS=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null | head -1)
  if [ -n "$CS" ]; then
    for t in ${SANITIZE_BINARIES:-test_device_gpu test_ops_gpu}; do
      [ -x "$BIN/$t" ] || continue
      for tool in ${SANITIZE_TOOLS:-memcheck racecheck synccheck initcheck}; do
        extra=()
        filter=${SANITIZE_FILTER:-}
        case $tool in
          memcheck) extra=(--leak-check full) ;;
          racecheck)
            filter=${filter:-*}-*MatchesReferenceAndCublasLt*:*FastAccumulation*:*RandomSequencesOfOps*
            filter=$filter:*DispatcherMeasuresOnce*:*SwigluGpu*ws2_1024x1024*:*PushesOnSeveralStreams*
            extra=(--kernel-name-exclude kns=nccl) ;;
          synccheck) extra=(--kernel-name-exclude kns=nccl) ;;
          initcheck)
            # test_ops_gpu: its op tests run ranks whose kernels wait for their peers' pushes
            # and flags, on every path, which one kernel at a time can only time out (2 x H100,
            # the native tests left out: 2 passed, every other test that ran failed so). Only
            # the two that passed run, unless SANITIZE_FILTER names others.
            if [ "$t" = test_ops_gpu ] && [ -z "${SANITIZE_FILTER:-}" ]; then
              filter='*CaptureRefuses*:*FallbackThroughNccl*'
            fi
            serial='NativeGemm.ConsumesChunks*:NativeGemm.OpNumberedFlagsWrapAround:CudaReduce.WhenFlagged*:CudaWaitFlags.*'
            filter=${filter:-*}-$serial ;;
        esac
        # The binary's tests in SANITIZE_SHARDS gtest shards, SANITIZE_JOBS of them at once
        # (separate processes, the GPUs shared: under a sanitizer the host's instrumentation, not
        # the GPU, bounds a test). racecheck's processes grow by about 1 GiB of host memory a
        # second each (to 50-85 GiB a rank process on 2 x H100 and H200; 6 or more shards at once
        # had the kernel's OOM killer take ranks): by default it runs one shard per 96 GiB
        # available, the other tools all shards at once.
        t0=$(date +%s)
        shards=${SANITIZE_SHARDS:-6}
        indices=${SANITIZE_SHARD_INDICES:-$(seq 0 $((shards - 1)))}
        jobs=${SANITIZE_JOBS:-}
        if [ -z "$jobs" ]; then
          jobs=$shards
          if [ "$tool" = racecheck ]; then
            jobs=$(awk '/^MemAvailable:/ {n = int($2 / (96 * 1048576)); print (n < 1 ? 1 : n)}' /proc/meminfo)
          fi
        fi
        case $jobs in
          '' | *[!0-9]* | 0) echo "SANITIZE_JOBS must be a positive integer, got '$jobs'"; exit 2 ;;
        esac
        rm -f "$OUT"/sanitize_${t}_${tool}_*.rc
        for i in $indices; do
          while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n; done
          # Each shard's status in a file: wait -n has already reaped some of them.
          (
            GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i ASYNCTP_TIMEOUT=${SANITIZE_TIMEOUT:-120} \
              timeout "${SANITIZE_LIMIT:-600}" "$CS" --tool "$tool" --target-processes all \
              --error-exitcode 9 --report-api-errors no "${extra[@]}" ${SANITIZE_ARGS:-} "$BIN/$t" \
              ${filter:+--gtest_filter=$filter} > "$OUT/sanitize_${t}_${tool}_$i.log" 2>&1
            echo $? > "$OUT/sanitize_${t}_${tool}_$i.rc"
          ) &
        done
        wait
        # The worst shard's status; a shard that left none (its subshell killed) counts as 255.
        rc=0
        for i in $indices; do
          r=$(cat "$OUT/sanitize_${t}_${tool}_$i.rc" 2>/dev/null || echo 255)
          [ "$r" -gt "$rc" ] && rc=$r
        done
        rm -f "$OUT"/sanitize_${t}_${tool}_*.rc
        echo "== compute-sanitizer --tool $tool $t (shards $(echo $indices) of $shards, $jobs at once): rc $rc, $(($(date +%s) - t0)) s"
        cat "$OUT"/sanitize_${t}_${tool}_*.log > "$OUT/sanitize_${t}_$tool.log"
        rm -f "$OUT"/sanitize_${t}_${tool}_*.log
        grep -E "ERROR SUMMARY|LEAK SUMMARY|RACECHECK SUMMARY|FAILED  \]" "$OUT/sanitize_${t}_$tool.log" \
          | sort | uniq -c | head -8
        echo "   tests run: $(grep -hoE "[0-9]+ tests? from [0-9]+ test suites? ran" "$OUT/sanitize_${t}_$tool.log" \
          | awk '{n += $1} END {print n + 0}')"
        [ $rc -eq 0 ] || status=1
      done
    done
  else
    echo "== compute-sanitizer: not found, skipped"
  fi
fi

if step bench; then
  echo "== asynctp bench --suite anchors ($NGPU ranks)"
  from=$(( $(cat "$OUT/clocks.csv" 2>/dev/null | wc -l) + 1 )); sample_clocks
  # The dispatcher logs its measurements (info) to bench.err.
  ASYNCTP_LOG_LEVEL=info "$BIN/asynctp" launch --nproc "$NGPU" --timeout 500 -- "$BIN/asynctp" bench --suite anchors --json ${BENCH_ARGS:-} \
    > "$OUT/bench.jsonl" 2> "$OUT/bench.err" || status=1
  python3 - "$OUT/bench.jsonl" <<'PY' | tee "$OUT/bench.txt"
import json, sys
for line in open(sys.argv[1]):
    line = line.split("] ", 1)[-1]
    if not line.startswith("{"): continue
    d = json.loads(line)
    print(f"world {d['world_size']}, {d['backend']} ({d.get('hardware', '?')}), {d['dtype']}, peer bandwidth {d['peer_bandwidth_GBps']:.0f} GB/s, us:")
    print(f"{'op':6} {'shape':26} {'gemm':>7} {'ngemm':>7} {'ngsig':>7} {'ng/gemm':>7} {'splitg':>7} {'coll':>7} {'base':>7} {'split':>7} {'native':>7} {'npiece':>7} {'auto':>7} {'graph':>7} {'floor':>7} {'a/floor':>7} {'n/floor':>7} {'base/a':>6} {'err':>8} took")
    u = lambda v: f"{v*1e3:7.1f}" if v is not None else f"{'-':>7}"
    for r in d["results"]:
        ng, nat = r["native_gemm_ms"], r["native_path_ms"]
        print(f"{r['op']:6} {r['label']:26} {u(r['gemm_ms'])} {u(ng)} {u(r.get('native_gemm_signalled_ms'))} {(r['gemm_ms']/ng if ng else 0):7.3f} {u(r['split_gemm_ms'])} {u(r['collective_ms'])} {u(r['baseline_ms'])} "
              f"{u(r['split_path_ms'])} {u(nat)} {u(r.get('native_pieces_path_ms'))} {u(r['fused_ms'])} {u(r['fused_graph_ms'])} {u(r['floor_ms'])} {r['fused_over_floor']:7.3f} "
              f"{(nat/r['floor_ms'] if nat else 0):7.3f} {r['baseline_over_fused']:6.3f} {r['rel_error_fused']:8.1e} {r['path']}")
PY
  stop_clocks; summarize_clocks "asynctp bench" "$from"
  python3 - "$OUT/bench.jsonl" <<'PY' | tee "$OUT/bench_host.txt"
import json, sys
for line in open(sys.argv[1]):
    line = line.split("] ", 1)[-1]
    if not line.startswith("{"): continue
    for r in json.loads(line)["results"]:
        h = r.get("host_us") or {}
        print(f"host us  {r['op']:6} {r['label']:26} " + " ".join(f"{k} {v:.1f}" for k, v in sorted(h.items())))
PY
  tail -5 "$OUT/bench.err"
fi

if step demo; then
  echo "== asynctp demo ($NGPU ranks, Llama-3-70B-like MLP)"
  "$BIN/asynctp" launch --nproc "$NGPU" --timeout 300 -- "$BIN/asynctp" demo --tokens 8192 --hidden 8192 \
    --ffn 28672 --iters 20 --warmup 3 2>&1 | tee "$OUT/demo.txt" | tail -8 || status=1
fi

if step torch; then
  echo "== PyTorch anchors ($TORCH_BENCH, $NGPU processes)"
  if [ -f "$TORCH_BENCH" ]; then
    from=$(( $(cat "$OUT/clocks.csv" 2>/dev/null | wc -l) + 1 )); sample_clocks
    OUT="$OUT" timeout 900 torchrun --nproc-per-node "$NGPU" "$TORCH_BENCH" > "$OUT/torch.log" 2>&1 || status=1
    stop_clocks; summarize_clocks "PyTorch anchors" "$from"
    python3 - "$OUT/anchor.jsonl" <<'PY' | tee "$OUT/torch.txt"
import json, sys
def f(v): return f"{v:8.1f}" if isinstance(v, (int, float)) else f"{'err':>8}"
for line in open(sys.argv[1]):
    d = json.loads(line)
    if d.get("kind") in ("ag_mm", "mm_rs"):
        print(f"{d['kind']:6} {d['shape']:26} mm {f(d.get('mm_only'))} base {f(d.get('baseline'))} "
              f"fused {f(d.get('fused'))} graph {f(d.get('fused_graph'))} native {f(d.get('native'))}")
    elif d.get("kind") == "mlp_compile":
        print("mlp", {k: v for k, v in d.items() if k != "kind"})
PY
  else
    echo "no $TORCH_BENCH (copy ../shared/anchors/torch_asynctp_bench.py there and carry .carry)"
  fi
fi
exit $status
