"""Checks asynctp's executor against PyTorch eager on a real compiled graph (needs PyTorch; CI
does not run this; the executor's CI tests are tests/graph/).

    PYTHONPATH=python python3 tests/passes/graphs/validate_executor.py build/bin/asynctp

Compiles the test transformer block (generate.Block: RMSNorm, attention through
_scaled_dot_product_flash_attention_for_cpu, SwiGLU MLP) in f32 on one rank, exports its
forward and backward post-grad graphs, runs both with `asynctp run --inputs` on the same
parameters and input (the backward fed with the forward's saved tensors and a tangent of ones),
and compares the output and every gradient with PyTorch's. Exits 1 above 1e-5 relative.
"""

import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(__file__))
import generate  # noqa: E402
from asynctp.fx_export import capture_post_grad_graphs  # noqa: E402


def run(binary: str, graph: str, inputs: str, outputs: str) -> None:
    subprocess.run([binary, "run", graph, "--nproc", "1", "--inputs", inputs, "--save-outputs", outputs],
                   check=True, stdout=subprocess.DEVNULL)


def placeholders(doc: dict) -> list:
    return [n for n in doc["nodes"] if n["op"] == "placeholder"]


def main() -> None:
    binary = sys.argv[1]
    work = tempfile.mkdtemp(prefix="asynctp_validate_")
    torch.manual_seed(0)
    blk = generate.Block(dim=32, heads=2, hidden=64)
    x = torch.randn(2, 8, 32, requires_grad=True)
    with capture_post_grad_graphs(world_size=1) as graphs:
        blk_c = torch.compile(blk, dynamic=False)
        blk_c(x).sum().backward()
    fwd_path, bwd_path = graphs.write(os.path.join(work, "block"))
    fwd, bwd = json.load(open(fwd_path)), json.load(open(bwd_path))

    # Dynamo lifts the input first, then the parameters in order of first use (w1, w3, w2).
    ff = blk.feed_forward
    params = list(blk.parameters())[:6] + [ff.w1.weight, ff.w3.weight, ff.w2.weight]
    leaves = [x] + params
    fwd_in = os.path.join(work, "fwd_in")
    os.makedirs(fwd_in)
    for node, value in zip(placeholders(fwd), leaves, strict=True):
        assert list(value.shape) == node["val"]["shape"], node["name"]
        value.detach().contiguous().numpy().astype("<f4").tofile(os.path.join(fwd_in, node["name"] + ".bin"))
    fwd_out = os.path.join(work, "fwd_out")
    run(binary, fwd_path, fwd_in, fwd_out)

    # The backward reads the forward's saved tensors (its trailing outputs) and the tangent.
    bwd_in = os.path.join(work, "bwd_in")
    os.makedirs(bwd_in)
    saved = placeholders(bwd)[:-1]
    n_out = len(fwd["nodes"][-1]["args"][0])
    for i, node in enumerate(saved):
        src = os.path.join(fwd_out, f"output{n_out - len(saved) + i}.rank0.bin")
        os.link(src, os.path.join(bwd_in, node["name"] + ".bin"))
    tangent = placeholders(bwd)[-1]
    np.ones(tangent["val"]["shape"], dtype="<f4").tofile(os.path.join(bwd_in, tangent["name"] + ".bin"))
    bwd_out = os.path.join(work, "bwd_out")
    run(binary, bwd_path, bwd_in, bwd_out)

    for leaf in leaves:
        leaf.grad = None
    ref = blk(x)
    ref.sum().backward()
    checks = [("output", ref.detach(), os.path.join(fwd_out, "output0.rank0.bin"))]
    checks += [(f"grad {i}", leaf.grad, os.path.join(bwd_out, f"output{i}.rank0.bin")) for i, leaf in enumerate(leaves)]
    worst = 0.0
    for name, want, path in checks:
        got = np.fromfile(path, dtype="<f4").reshape(want.shape)
        err = float(np.linalg.norm(got - want.numpy()) / max(np.linalg.norm(want.numpy()), 1e-30))
        worst = max(worst, err)
        print(f"{name:8s} relative error {err:.2e}")
    print("OK" if worst <= 1e-5 else "MISMATCH")
    sys.exit(0 if worst <= 1e-5 else 1)


if __name__ == "__main__":
    main()
