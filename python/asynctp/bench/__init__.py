"""Benchmarks of asynctp from PyTorch.

    torchrun --nproc-per-node 2 -m asynctp.bench.layer --help

layer: a sequence-parallel Llama-3 decoder layer, forward and backward, eager PyTorch,
torch.compile (with and without PyTorch's async TP) and asynctp (eager modules and the
torch.compile pass), validated against eager PyTorch, then timed under sustained load.

host: the host time of one eager fused-op call from Python (tests/python/run_gpu.py's host_us
calls), split into the library's phases (its host profile) and Python's part.

swiglu: the gate/up projection of a SwiGLU MLP, op by op: the SwiGLU in the fused GEMM's
epilogue against the fused projection followed by an eager or a compiled SwiGLU, and the GEMM
alone.
"""
