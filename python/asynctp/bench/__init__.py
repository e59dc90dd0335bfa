"""Benchmarks of asynctp from PyTorch.

    torchrun --nproc-per-node 2 -m asynctp.bench.layer --help

layer: a sequence-parallel Llama-3 decoder layer, forward and backward, eager PyTorch,
torch.compile (with and without PyTorch's async TP) and asynctp (eager modules and the
torch.compile pass), validated against eager PyTorch, then timed under sustained load.
"""
