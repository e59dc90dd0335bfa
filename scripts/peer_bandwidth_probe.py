"""Copy-engine bandwidth between the GPUs of one node, in the patterns the fused ops use.

One process drives every visible GPU through CuPy (cudaMemcpyPeerAsync on an explicit stream of
the GPU that issues the copy: the receiver for a pull, the sender for a push; peer access
enabled between every pair). Prints GB/s per receiving GPU, the median of --iters timings of
each pattern, every GPU joined before the clock stops:

  one-pull      GPU 0 pulls from GPU 1, all other GPUs idle
  ring-pull     every GPU r pulls from r+1 at once (one stream per GPU)
  seq-pull      every GPU pulls from r+1, r+2, ... one after another on one stream (what the
                bench's peer-bandwidth probe does)
  all-pull      every GPU pulls from all its peers at once (a stream per peer)
  one-all-pull  GPU 0 pulls from all its peers at once, the others idle
  seq-push      every GPU r pushes to r-1, r-2, ... one after another (the native all-gather)
  all-push      every GPU pushes to all its peers at once (a stream per peer)

Usage: python3 scripts/peer_bandwidth_probe.py [--mib 64] [--iters 20]
"""
import argparse
import statistics
import time

import cupy
from cupy.cuda import runtime


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=64, help="MiB per copy")
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args()
    n = runtime.getDeviceCount()
    if n < 2:
        raise SystemExit(f"needs 2 or more GPUs, found {n}")
    size = args.mib << 20
    src, dst, streams = [], [], []
    for d in range(n):
        with cupy.cuda.Device(d):
            for p in range(n):
                if p != d:
                    runtime.deviceEnablePeerAccess(p)
            src.append(cupy.ones(size, dtype=cupy.uint8))
            dst.append([cupy.empty(size, dtype=cupy.uint8) for _ in range(n)])
            streams.append([cupy.cuda.Stream(non_blocking=True) for _ in range(n)])

    def sync():
        for d in range(n):
            with cupy.cuda.Device(d):
                runtime.deviceSynchronize()

    def copy(on_dev, k, to_dev, slot, from_dev):
        with cupy.cuda.Device(on_dev):
            runtime.memcpyPeerAsync(dst[to_dev][slot].data.ptr, to_dev, src[from_dev].data.ptr,
                                    from_dev, size, streams[on_dev][k].ptr)

    patterns = {
        "one-pull": (lambda: copy(0, 0, 0, 1, 1), 1, 1),
        "ring-pull": (lambda: [copy(r, 0, r, 1, (r + 1) % n) for r in range(n)], 1, n),
        "seq-pull": (lambda: [copy(r, 0, r, i, (r + i) % n) for i in range(1, n) for r in range(n)],
                     n - 1, n),
        "all-pull": (lambda: [copy(r, i, r, i, (r + i) % n) for i in range(1, n) for r in range(n)],
                     n - 1, n),
        "one-all-pull": (lambda: [copy(0, i, 0, i, i) for i in range(1, n)], n - 1, 1),
        "seq-push": (lambda: [copy(r, 0, (r - i) % n, i, r) for i in range(1, n) for r in range(n)],
                     n - 1, n),
        "all-push": (lambda: [copy(r, i, (r - i) % n, i, r) for i in range(1, n) for r in range(n)],
                     n - 1, n),
    }
    print(f"{n} GPUs, {args.mib} MiB per copy, median of {args.iters}")
    for name, (fn, copies_per_receiver, receivers) in patterns.items():
        for _ in range(3):
            fn()
        sync()
        times = []
        for _ in range(args.iters):
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            times.append(time.perf_counter() - t0)
        t = statistics.median(times)
        gbps = copies_per_receiver * size / t / 1e9
        print(f"{name:13} {t * 1e6:9.1f} us  {gbps:6.1f} GB/s per receiving GPU ({receivers} receiving)")


if __name__ == "__main__":
    main()
