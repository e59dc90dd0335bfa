"""torch.ops.asynctp.* on the CPU backend (gloo) against torch's own unfused reference:
torch.distributed.all_gather_into_tensor / reduce_scatter_tensor plus matmul.

Numeric contract checked here: asynctp accumulates in f32 and sums reduce-scatter partials in f32
in a fixed rank order, rounding once; the reference computes in f32 and rounds once, so the
outputs agree within TOL (f32: rtol 1e-5; f16 / bf16: a couple of their ulps of the largest
value), the all-gathered A exactly.

Every case runs on every rank of a pool (conftest.py): the functions below whose names start
with `case_` run inside the ranks; the tests only send them and check that no rank failed.
"""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.distributed as dist

import asynctp
import asynctp.torch as atp

OPS = torch.ops.asynctp
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
# (rtol, atol as a fraction of the reference's largest magnitude)
TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 1.6e-2)}

# A shard shapes (per rank) and the gather / scatter dims each is run with: 2-D and 3-D, every
# dim (the last is the contraction dim for all-gather, and B's N for reduce-scatter).
AG_SHAPES = [((4, 16), (0, 1, -1)), ((2, 3, 8), (0, 1, 2))]
K, N = 16, 12


def _world():
    return dist.get_rank(), dist.get_world_size()


def _randn(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) / 4).to(dtype)


def _assert_close(out, ref, what):
    rtol, atol = TOL.get(out.dtype, (1e-5, 1e-5))
    ref = ref.to(torch.float32)
    scale = max(ref.abs().max().item(), 1.0)
    torch.testing.assert_close(out.to(torch.float32), ref, rtol=rtol, atol=atol * scale, msg=lambda m: f"{what}: {m}")


def _all_gather(t, dim, group=None):
    """torch's unfused all-gather of t along dim (any dim), through gloo."""
    ws = dist.get_world_size(group)
    moved = t.movedim(dim, 0).contiguous()
    if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        out = torch.empty((ws * moved.shape[0], *moved.shape[1:]), dtype=torch.uint8)
        dist.all_gather_into_tensor(out, moved.view(torch.uint8), group=group)
        out = out.view(t.dtype)
    else:
        out = torch.empty((ws * moved.shape[0], *moved.shape[1:]), dtype=t.dtype)
        dist.all_gather_into_tensor(out, moved, group=group)
    return out.movedim(0, dim)


def _reduce_scatter(t, dim, op, group=None):
    """torch's unfused reduce-scatter of f32 t along dim ("sum" or "avg")."""
    ws = dist.get_world_size(group)
    moved = t.movedim(dim, 0).contiguous()
    out = torch.empty((moved.shape[0] // ws, *moved.shape[1:]), dtype=t.dtype)
    dist.reduce_scatter_tensor(out, moved, group=group)
    if op == "avg":
        out /= ws
    return out.movedim(0, dim)


def _group_name(group=None):
    return (group or dist.group.WORLD).group_name


# ---- all_gather_matmul ----------------------------------------------------------------------


def case_all_gather_matmul(dtype_name, group=None):
    dtype = DTYPES[dtype_name]
    rank, _ = _world()
    name = _group_name(group)
    ws = dist.get_world_size(group)
    for (shape, dims), num_bs, return_A in itertools.product(AG_SHAPES, (1, 2), (True, False)):
        for gather_dim in dims:
            g = gather_dim % len(shape)
            what = f"shape {shape} gather_dim {gather_dim} num_bs {num_bs} return_A {return_A}"
            A = _randn(shape, dtype, 100 + rank)
            k = shape[-1] * (ws if g == len(shape) - 1 else 1)
            Bs = [_randn((k, N + 4 * i), dtype, 7 + i) for i in range(num_bs)]
            A_out, outs = OPS.fused_all_gather_matmul(A, Bs, gather_dim, name, return_A=return_A)
            A_ref = _all_gather(A, g, group)
            if return_A:
                assert torch.equal(A_out, A_ref), what
            else:
                assert A_out is None, what
            assert len(outs) == num_bs, what
            for i, (out, B) in enumerate(zip(outs, Bs)):
                assert out.dtype == dtype and out.shape == (*A_ref.shape[:-1], B.shape[1]), what
                _assert_close(out, A_ref.float() @ B.float(), f"{what} out {i}")
    return True


@pytest.mark.parametrize("dtype_name", list(DTYPES))
def test_all_gather_matmul(pool, dtype_name):
    pool.run(case_all_gather_matmul, dtype_name)


def test_all_gather_matmul_ws8(pool8):
    pool8.run(case_all_gather_matmul, "bf16")


def case_empty_shards():
    """Shards with no rows, every dtype and gather dim: empty outputs of the right shapes (a
    16-bit gather on the contraction dim has an empty f32 accumulator)."""
    _, ws = _world()
    name = _group_name()
    for dtype, (shape, dim) in itertools.product(
            DTYPES.values(), [((0, 8), 1), ((0, 8), -1), ((0, 3, 8), 2), ((2, 0, 8), 2),
                              ((0, 3, 8), 0), ((0, 3, 8), 1)]):
        what = f"{dtype} shape {shape} gather_dim {dim}"
        A = torch.zeros(shape, dtype=dtype)
        k = shape[-1] * (ws if dim % len(shape) == len(shape) - 1 else 1)
        B = _randn((k, N), dtype, 3)
        A_out, (out,) = OPS.fused_all_gather_matmul(A, [B], dim, name)
        A_ref = _all_gather(A, dim % len(shape))
        assert A_out.shape == A_ref.shape and out.shape == (*A_ref.shape[:-1], N), what
        _, pre, act = OPS.fused_all_gather_matmul_swiglu(A, B, dim, name, return_pre=True)
        assert pre.shape == out.shape and act.shape == (*A_ref.shape[:-1], N // 2), what
    return True


def test_empty_shards(pool):
    pool.run(case_empty_shards)


def _one_element_in(t):
    """A copy of t that starts one element into its storage: off the native kernel's 16-byte
    alignment (a fused weight's slice can be such a view)."""
    view = torch.empty(t.numel() + 1, dtype=t.dtype)[1:].view(t.shape)
    return view.copy_(t)


def case_misaligned_views():
    """Operands one element into their storage, after an aligned call of the same shapes took the
    native path: each op runs them on another path, with the unfused result."""
    rank, ws = _world()
    name = _group_name()
    taken = []
    A = _randn((128, 32), torch.bfloat16, 100 + rank)
    B = _randn((32, 24), torch.bfloat16, 7)
    for b in (B, _one_element_in(B)):
        _, (out,) = atp.fused_all_gather_matmul(A, [b], 0, name)
        taken.append(atp.last_path("all_gather_matmul", name)[0])
        _assert_close(out, _all_gather(A, 0).float() @ B.float(), f"AG+MM, B {taken[-1]}")
    A_rs = _randn((128 * ws, 32), torch.bfloat16, 200 + rank)
    for a in (A_rs, _one_element_in(A_rs)):
        out = atp.fused_matmul_reduce_scatter(a, B, "sum", 0, name)
        taken.append(atp.last_path("matmul_reduce_scatter", name)[0])
        _assert_close(out, _reduce_scatter(A_rs.float() @ B.float(), 0, "sum"),
                      f"MM+RS, A {taken[-1]}")
    return taken


def test_misaligned_views(pool):
    for taken in pool.run(case_misaligned_views):
        assert taken == ["native", "split", "native", "split"]


# ---- matmul_reduce_scatter and the sum of products -------------------------------------------

RS_SHAPES = [((8, 16), (0, 1, -1)), ((4, 6, 8), (0, 1, 2))]


def _rs_inputs(shape, g, dtype, ws, rank, seed):
    """A [.., M@g, .., K] with M = shape[g] * ws (or N = N * ws when g is the last dim)."""
    full = list(shape)
    n = N * ws if g == len(shape) - 1 else N
    if g != len(shape) - 1:
        full[g] *= ws
    return _randn(full, dtype, seed + rank), _randn((shape[-1], n), dtype, seed + 50 + rank)


def case_matmul_reduce_scatter(dtype_name, group=None):
    dtype = DTYPES[dtype_name]
    rank, _ = _world()
    name = _group_name(group)
    ws = dist.get_world_size(group)
    for (shape, dims), op in itertools.product(RS_SHAPES, ("sum", "avg")):
        for scatter_dim in dims:
            g = scatter_dim % len(shape)
            what = f"shape {shape} scatter_dim {scatter_dim} {op}"
            A, B = _rs_inputs(shape, g, dtype, ws, rank, 300)
            out = OPS.fused_matmul_reduce_scatter(A, B, op, scatter_dim, name)
            ref = _reduce_scatter(A.float() @ B.float(), g, op, group)
            assert out.dtype == dtype and out.shape == ref.shape, what
            _assert_close(out, ref, what)
            # The sum of two products before one reduce-scatter.
            A2, B2 = _rs_inputs(shape, g, dtype, ws, rank, 600)
            out = OPS.fused_matmuls_reduce_scatter([A, A2], [B, B2], op, scatter_dim, name)
            ref = _reduce_scatter(A.float() @ B.float() + A2.float() @ B2.float(), g, op, group)
            _assert_close(out, ref, f"{what} (two products)")
    return True


@pytest.mark.parametrize("dtype_name", list(DTYPES))
def test_matmul_reduce_scatter(pool, dtype_name):
    pool.run(case_matmul_reduce_scatter, dtype_name)


def test_matmul_reduce_scatter_ws8(pool8):
    pool8.run(case_matmul_reduce_scatter, "bf16")


# ---- float8 -----------------------------------------------------------------------------------

F8 = torch.float8_e4m3fn


def _f8(shape, seed):
    return _randn(shape, torch.float32, seed).mul(4).to(F8)


def case_all_gather_scaled_matmul(scaling):
    rank, ws = _world()
    name = _group_name()
    for gather_dim, out_dtype in itertools.product((0, 1), (torch.bfloat16, torch.float32)):
        shape = (4, 3, 16)
        what = f"{scaling} gather_dim {gather_dim} out {out_dtype}"
        A = _f8(shape, 10 + rank)
        B = _f8((N, 16), 20).t()  # column-major, as _scaled_mm wants
        if scaling == "tensor":
            A_scale = torch.tensor(0.5)
            B_scale = torch.tensor(0.25)
        else:
            A_scale = _randn((*shape[:-1], 1), torch.float32, 30 + rank).abs() + 0.5
            B_scale = _randn((1, N), torch.float32, 40).abs() + 0.5
        A_out, (out,) = OPS.fused_all_gather_scaled_matmul(
            A, [B], A_scale, [B_scale], gather_dim, name, [None], [None], [out_dtype], [False])
        A_ref = _all_gather(A, gather_dim)
        assert torch.equal(A_out.view(torch.uint8), A_ref.view(torch.uint8)), what
        scale_ref = A_scale if scaling == "tensor" else _all_gather(A_scale, gather_dim)
        ref = torch._scaled_mm(
            A_ref.flatten(0, -2), B, scale_ref.flatten(0, -2) if scale_ref.dim() > 1 else scale_ref,
            B_scale, out_dtype=torch.float32).view(*A_ref.shape[:-1], N)
        assert out.dtype == out_dtype and out.shape == ref.shape, what
        _assert_close(out, ref, what)
        if scaling == "row" and ws > 1:
            # A row-wise scale of the gathered A (replicated on every rank) is accepted too.
            _, (out2,) = OPS.fused_all_gather_scaled_matmul(
                A, [B], scale_ref, [B_scale], gather_dim, name, [None], [None], [out_dtype], [True])
            _assert_close(out2, ref, f"{what} (replicated scale, use_fast_accum)")
    return True


def case_scaled_matmul_reduce_scatter(scaling):
    rank, ws = _world()
    name = _group_name()
    for scatter_dim, reshaped in itertools.product((0, 1), (False, True)):
        what = f"{scaling} scatter_dim {scatter_dim} reshaped {reshaped}"
        full = [2 * ws, 3 * ws, 16]
        A3 = _f8(full, 50 + rank)
        B = _f8((N, 16), 60 + rank).t()
        if scaling == "tensor":
            A_scale3, B_scale = torch.tensor(0.5), torch.tensor(0.125)
        else:
            A_scale3 = _randn((*full[:-1], 1), torch.float32, 70 + rank).abs() + 0.5
            B_scale = _randn((1, N), torch.float32, 80 + rank).abs() + 0.5
        output_shape = [*full[:-1], N]
        if reshaped:
            # The micro-pipeline-TP pass's form: A flattened to 2-D, output_shape 3-D.
            if scatter_dim != 0:
                continue
            A, A_scale = A3.flatten(0, -2), (A_scale3 if A_scale3.numel() == 1 else A_scale3.flatten(0, -2))
            after = 0
        else:
            A, A_scale, after = A3, A_scale3, scatter_dim
        out = OPS.fused_scaled_matmul_reduce_scatter(
            A, B, A_scale, B_scale, "sum", scatter_dim, after, name, output_shape,
            out_dtype=torch.bfloat16)
        ref_scale = A_scale3 if A_scale3.numel() == 1 else A_scale3.flatten(0, -2)
        product = torch._scaled_mm(A3.flatten(0, -2), B, ref_scale, B_scale, out_dtype=torch.float32)
        ref = _reduce_scatter(product.view(output_shape), scatter_dim, "sum")
        assert out.dtype == torch.bfloat16 and out.shape == ref.shape, what
        _assert_close(out, ref, what)
    return True


def case_scaled_fast_accum():
    """use_fast_accum reaches the ops (per B for the all-gather form): accepted, and the results
    match PyTorch's unfused _scaled_mm with the same use_fast_accum (the CPU backend accumulates
    in f32 whatever it says). With fast accumulation for every B the native path takes the
    all-gather (B column-major, as _scaled_mm wants it), without it the split path; and the
    reduce-scatter where its chunks are whole 128-row tiles."""
    rank, ws = _world()
    name = _group_name()
    shape = (4, 3, 16)
    A = _f8(shape, 110 + rank)
    Bs = [_f8((N, 16), 120).t(), _f8((N + 2, 16), 121).t()]
    A_scale = _randn((*shape[:-1], 1), torch.float32, 130 + rank).abs() + 0.5
    B_scales = [_randn((1, B.shape[1]), torch.float32, 140 + i).abs() + 0.5
                for i, B in enumerate(Bs)]
    A_ref = _all_gather(A, 0)
    scale_ref = _all_gather(A_scale, 0).flatten(0, -2)
    for fast in ([True, True], [True, False], [False, True]):
        what = f"all_gather use_fast_accum {fast}"
        _, outs = OPS.fused_all_gather_scaled_matmul(
            A, Bs, A_scale, B_scales, 0, name, [None, None], [None, None],
            [torch.bfloat16, torch.float32], fast)
        for i, (B, B_scale, f, out) in enumerate(zip(Bs, B_scales, fast, outs)):
            ref = torch._scaled_mm(A_ref.flatten(0, -2), B, scale_ref, B_scale,
                                   out_dtype=torch.float32, use_fast_accum=f)
            _assert_close(out, ref.view(*A_ref.shape[:-1], B.shape[1]), f"{what} B {i}")
        path, reason = atp.last_path("all_gather_scaled_matmul", name)
        assert path == ("native" if all(fast) else "split"), (what, path, reason)
    with pytest.raises(asynctp.InvalidArgumentError, match="use_fast_accum"):
        OPS.fused_all_gather_scaled_matmul(
            A, Bs, A_scale, B_scales, 0, name, [None, None], [None, None], [None, None], [True])
    full = [2 * ws, 3, 16]
    A3 = _f8(full, 150 + rank)
    B = _f8((N, 16), 160 + rank).t()
    A_scale3 = _randn((*full[:-1], 1), torch.float32, 170 + rank).abs() + 0.5
    B_scale = _randn((1, N), torch.float32, 180 + rank).abs() + 0.5
    for fast in (True, False):
        out = OPS.fused_scaled_matmul_reduce_scatter(
            A3, B, A_scale3, B_scale, "sum", 0, 0, name, [*full[:-1], N],
            out_dtype=torch.bfloat16, use_fast_accum=fast)
        product = torch._scaled_mm(A3.flatten(0, -2), B, A_scale3.flatten(0, -2), B_scale,
                                   out_dtype=torch.float32, use_fast_accum=fast)
        ref = _reduce_scatter(product.view(*full[:-1], N), 0, "sum")
        _assert_close(out, ref, f"reduce_scatter use_fast_accum {fast}")
    # Chunks of 128 rows and N a multiple of 8, which the native reduce-scatter needs: it takes
    # the call with fast accumulation.
    A4 = _f8((128 * ws, 16), 190 + rank)
    A_scale4 = _randn((128 * ws, 1), torch.float32, 191 + rank).abs() + 0.5
    B4 = _f8((16, 16), 192 + rank).t()
    B_scale4 = _randn((1, 16), torch.float32, 193 + rank).abs() + 0.5
    out = OPS.fused_scaled_matmul_reduce_scatter(
        A4, B4, A_scale4, B_scale4, "sum", 0, 0, name, [128 * ws, 16], out_dtype=torch.bfloat16,
        use_fast_accum=True)
    path, reason = atp.last_path("scaled_matmul_reduce_scatter", name)
    assert path == "native", (path, reason)
    product = torch._scaled_mm(A4, B4, A_scale4, B_scale4, out_dtype=torch.float32,
                               use_fast_accum=True)
    _assert_close(out, _reduce_scatter(product, 0, "sum"), "native reduce_scatter")
    return True


def test_scaled_fast_accum(pool):
    pool.run(case_scaled_fast_accum)


@pytest.mark.parametrize("scaling", ["tensor", "row"])
def test_all_gather_scaled_matmul(pool, scaling):
    pool.run(case_all_gather_scaled_matmul, scaling)


@pytest.mark.parametrize("scaling", ["tensor", "row"])
def test_scaled_matmul_reduce_scatter(pool, scaling):
    pool.run(case_scaled_matmul_reduce_scatter, scaling)


def test_scaled_ops_ws8(pool8):
    pool8.run(case_all_gather_scaled_matmul, "row")
    pool8.run(case_scaled_matmul_reduce_scatter, "tensor")


# ---- a TP subgroup of a 2 x 2 mesh -----------------------------------------------------------


def case_mesh_subgroup():
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    tp = mesh.get_group("tp")
    assert dist.get_world_size(tp) == 2
    case_all_gather_matmul("f32", group=tp)
    case_matmul_reduce_scatter("bf16", group=tp)
    # The DP groups too, side by side with the TP groups in one process.
    case_matmul_reduce_scatter("f32", group=mesh.get_group("dp"))
    return sorted(g for g in (tp.group_name, mesh.get_group("dp").group_name))


def test_mesh_subgroup(pool4):
    names = pool4.run(case_mesh_subgroup)
    assert len({tuple(n) for n in names}) == 4  # each rank's (dp, tp) pair differs


# ---- opcheck ----------------------------------------------------------------------------------


def case_opcheck():
    from torch.library import opcheck

    name = _group_name()
    A, B = _randn((4, 16), torch.float32, 1), _randn((16, 8), torch.float32, 2)
    opcheck(OPS.fused_all_gather_matmul, (A, [B, B], 0, name), {"return_A": True})
    opcheck(OPS.fused_all_gather_matmul, (A.view(2, 2, 16), [B], 1, name), {"return_A": False})
    opcheck(OPS.fused_matmul_reduce_scatter, (A, B, "sum", 0, name))
    opcheck(OPS.fused_matmuls_reduce_scatter, ([A, A], [B, B], "avg", 1, name))
    A8, B8 = _f8((4, 16), 3), _f8((8, 16), 4).t()
    s = torch.tensor(0.5)
    # opcheck's test_schema compares inputs before and after with allclose, which torch does not
    # implement for float8 on CPU; the other checks run.
    f8_checks = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
    opcheck(OPS.fused_all_gather_scaled_matmul,
            (A8, [B8], s, [s], 0, name, [None], [None], [torch.bfloat16], [False]),
            test_utils=f8_checks)
    opcheck(OPS.fused_scaled_matmul_reduce_scatter,
            (A8, B8, s, s, "sum", 0, 0, name, [4, 8]), {"out_dtype": torch.bfloat16},
            test_utils=f8_checks)
    return True


def test_opcheck(pool):
    if pool.world_size > 2:
        pytest.skip("opcheck at ws 1 and 2 (its checks do not depend on the world size)")
    pool.run(case_opcheck)


def test_schemas_match_symm_mem():
    """The four fused ops have exactly torch.ops.symm_mem's schemas (names and arguments)."""
    import torch.distributed._symmetric_memory  # noqa: F401 (defines torch.ops.symm_mem)

    for op in ("fused_all_gather_matmul", "fused_all_gather_scaled_matmul",
               "fused_matmul_reduce_scatter", "fused_scaled_matmul_reduce_scatter"):
        ours = getattr(OPS, op).default._schema
        theirs = getattr(torch.ops.symm_mem, op).default._schema
        assert str(ours).replace("asynctp::", "") == str(theirs).replace("symm_mem::", ""), op


# ---- dynamic shapes ----------------------------------------------------------------------------


def case_fake_dynamic():
    """The fake kernels under symbolic shapes (torch.compile with dynamic=True on the eager
    backend traces them with SymInts, then runs the real kernels)."""
    name = _group_name()
    ws = dist.get_world_size()

    def f(a, b):
        _, (o,) = OPS.fused_all_gather_matmul(a, [b], 0, name, return_A=False)
        return OPS.fused_matmul_reduce_scatter(o, b.t().contiguous(), "sum", 0, name)

    compiled = torch.compile(f, backend="aot_eager", dynamic=True, fullgraph=True)
    for rows in (2, 3):
        a, b = _randn((rows * ws, 8), torch.float32, 5), _randn((8, 8), torch.float32, 6)
        _assert_close(compiled(a, b), f(a, b), f"rows {rows}")
    return True


def test_fake_dynamic(pool2):
    pool2.run(case_fake_dynamic)


# ---- errors -------------------------------------------------------------------------------


def _raises(cls, fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
    except cls as exc:
        return str(exc)
    except BaseException as exc:  # noqa: BLE001
        raise AssertionError(f"{fn}: expected {cls.__name__}, got {type(exc).__name__}: {exc}")
    raise AssertionError(f"{fn}: expected {cls.__name__}, nothing raised")


def case_errors():
    rank, ws = _world()
    name = _group_name()
    A, B = _randn((4, 16), torch.float32, 1), _randn((16, 8), torch.float32, 2)
    ag, rs = OPS.fused_all_gather_matmul, OPS.fused_matmul_reduce_scatter
    Bad = asynctp.InvalidArgumentError
    # dtype
    _raises(Bad, ag, A.double(), [B.double()], 0, name)
    _raises(Bad, ag, A, [B.bfloat16()], 0, name)
    _raises(Bad, rs, A.int(), B.int(), "sum", 0, name)
    # shape
    _raises(Bad, ag, A, [B[None]], 0, name)
    _raises(Bad, ag, A, [], 0, name)
    _raises(Bad, ag, A, [B], 2, name)
    _raises(Bad, ag, A, [B[:8]], 0, name)  # K 16 against B's 8 rows: the library says so
    if ws > 1:
        _raises(Bad, rs, A[:3], B, "sum", 0, name)  # 3 rows do not split over the ranks
    _raises(Bad, rs, A, B, "max", 0, name)
    _raises(Bad, OPS.fused_matmuls_reduce_scatter, [A], [B, B], "sum", 0, name)
    # devices: the dispatcher sends a call with one meta tensor to the fake kernel, which must
    # not answer a CPU A with meta outputs
    _raises(Bad, ag, A, [B.to("meta")], 0, name)
    _raises(Bad, ag, A.to("meta"), [B], 0, name)
    _raises(Bad, rs, A, B.to("meta"), "sum", 0, name)
    _raises(Bad, OPS.fused_matmuls_reduce_scatter, [A, A.to("meta")], [B, B], "sum", 0, name)
    _raises(Bad, OPS.fused_all_gather_matmul_swiglu, A, B.to("meta"), 0, name)
    # group
    _raises(Bad, ag, A, [B], 0, "no-such-group")
    # unsupported arguments
    A8, B8 = _f8((4, 16), 3), _f8((8, 16), 4).t()
    s = torch.tensor(1.0)
    bias = torch.zeros(8, dtype=torch.bfloat16)
    _raises(asynctp.UnsupportedError, OPS.fused_all_gather_scaled_matmul,
            A8, [B8], s, [s], 0, name, [bias], [None], [torch.bfloat16], [False])
    _raises(asynctp.UnsupportedError, OPS.fused_all_gather_scaled_matmul,
            A8, [B8], s, [s], 0, name, [None], [s], [torch.bfloat16], [False])
    _raises(asynctp.UnsupportedError, OPS.fused_scaled_matmul_reduce_scatter,
            A8, B8, s, s, "sum", 0, 0, name, [4, 8], bias=bias, out_dtype=torch.bfloat16)
    _raises(asynctp.UnsupportedError, OPS.fused_scaled_matmul_reduce_scatter,
            A8, B8, s, s, "sum", 0, 0, name, [4, 8], result_scale=s, out_dtype=torch.bfloat16)
    _raises(Bad, OPS.fused_all_gather_scaled_matmul,
            A8, [B8], s, [s, s], 0, name, [None], [None], [torch.bfloat16], [False])
    _raises(Bad, OPS.fused_scaled_matmul_reduce_scatter,
            A8, B8, s, s, "sum", 0, 1, name, [4, 8], out_dtype=torch.bfloat16)
    # output_shape's leading dims hold as many rows as A's: [2, 3] is 6 rows, A has 4
    _raises(Bad, OPS.fused_scaled_matmul_reduce_scatter,
            A8, B8, s, s, "sum", 0, 0, name, [2, 3, 8], out_dtype=torch.bfloat16)
    # reserve refuses what the op would refuse
    _raises(Bad, atp.reserve, ag, A, [B.bfloat16()], 0, name)
    _raises(Bad, atp.reserve, OPS.fused_all_gather_matmul_swiglu, A, B.bfloat16(), 0, name)
    _raises(Bad, atp.reserve, rs, A, B, "max", 0, name)
    _raises(Bad, atp.reserve, OPS.fused_matmuls_reduce_scatter, [A], [B], "min", 0, name)
    # Nothing above broke the group: the ops still run.
    OPS.fused_all_gather_matmul(A, [B], 0, name)
    return True


def test_errors(pool):
    if pool.world_size not in (1, 2):
        pytest.skip("errors at ws 1 and 2")
    pool.run(case_errors)


def case_not_a_member():
    rank, _ = _world()
    sub = dist.new_group([0])
    A, B = _randn((4, 16), torch.float32, 1), _randn((16, 8), torch.float32, 2)
    names = [None, None]
    dist.all_gather_object(names, sub.group_name if rank == 0 else None)
    if rank == 0:
        OPS.fused_all_gather_matmul(A, [B], 0, names[0])
        return "member"
    # Rank 1 names rank 0's subgroup, which it is not in.
    _raises(asynctp.InvalidArgumentError, OPS.fused_all_gather_matmul, A, [B], 0, names[0])
    return "refused"


def test_not_a_member(pool2):
    assert pool2.run(case_not_a_member) == ["member", "refused"]


# ---- timeouts, stats, release -------------------------------------------------------------


def case_timeout():
    """Rank 1 skips the second call: rank 0's op times out as asynctp.TimeoutError."""
    rank, _ = _world()
    atp.set_options(timeout_s=2, dispatch_cache="off")
    try:
        group = dist.new_group([0, 1])
        A, B = _randn((4, 16), torch.float32, 1), _randn((16, 8), torch.float32, 2)
        OPS.fused_all_gather_matmul(A, [B], 0, group.group_name)
        result = "skipped"
        if rank == 0:
            result = _raises(asynctp.TimeoutError, OPS.fused_all_gather_matmul, A, [B], 0, group.group_name)
        dist.barrier()  # rank 1 keeps its context until rank 0 has timed out
        dist.destroy_process_group(group)
        assert atp.memory_stats(group.group_name)["contexts"] == 0
        return result
    finally:
        atp.set_options(timeout_s=60, dispatch_cache="off")


def test_timeout(pool2):
    message, skipped = pool2.run(case_timeout)
    assert skipped == "skipped" and message


def case_path_that_cannot_run():
    """A path asked for by set_options that cannot run a call (f32 on the native path) raises
    asynctp.UnsupportedError saying why, on every rank; the default path then runs it."""
    atp.set_options(timeout_s=60, path="native", dispatch_cache="off")
    try:
        group = dist.new_group(list(range(dist.get_world_size())))
        A, B = _randn((4, 16), torch.float32, 1), _randn((16, 8), torch.float32, 2)
        message = _raises(asynctp.UnsupportedError, atp.fused_all_gather_matmul, A, [B], 0,
                          group.group_name)
        dist.destroy_process_group(group)
    finally:
        atp.set_options(timeout_s=60, dispatch_cache="off")
    group = dist.new_group(list(range(dist.get_world_size())))
    _, (out,) = atp.fused_all_gather_matmul(A, [B], 0, group.group_name)
    assert out.shape == (4 * dist.get_world_size(), 8)
    dist.destroy_process_group(group)
    return message


def test_path_that_cannot_run(pool2):
    for message in pool2.run(case_path_that_cannot_run):
        assert "the native path was requested but cannot run: inputs are not bf16" in message
        assert "; got inputs = f32" in message


def case_destroyed_by_torchs_own_function():
    """A group destroyed by torch's destroy_process_group as bound before asynctp.torch was
    imported (`from torch.distributed import destroy_process_group` at the top of a script)
    takes its contexts with it: its name is refused afterwards, never served by a context of
    the destroyed group (a later group can reuse the name, with other ranks)."""
    import torch.distributed.distributed_c10d as c10d

    torchs_own = c10d.destroy_process_group.__wrapped__
    A, B = _randn((4, 16), torch.float32, 1), _randn((16, 8), torch.float32, 2)
    for call in (OPS.fused_all_gather_matmul, atp.fused_all_gather_matmul):
        group = dist.new_group(list(range(dist.get_world_size())))
        name = group.group_name
        call(A, [B], 0, name)
        assert atp.memory_stats(name)["contexts"] == 1
        torchs_own(group)
        assert atp.memory_stats(name)["contexts"] == 0
        _raises(asynctp.InvalidArgumentError, call, A, [B], 0, name)
    return True


def test_destroyed_by_torchs_own_function(pool2):
    pool2.run(case_destroyed_by_torchs_own_function)


def case_reserve():
    name = _group_name()
    A, B = _randn((8, 16), torch.float32, 1), _randn((16, 8), torch.float32, 2)
    atp.reserve(OPS.fused_all_gather_matmul, A, [B], 0, name)
    atp.reserve(OPS.fused_matmul_reduce_scatter, A, B, "sum", 0, name)
    reserved = atp.memory_stats(name)
    assert reserved["symmetric_bytes"] > 0, reserved
    _, (out,) = OPS.fused_all_gather_matmul(A, [B], 0, name)
    _assert_close(out, _all_gather(A, 0) @ B, "after reserve")
    rs = OPS.fused_matmul_reduce_scatter(A, B, "sum", 0, name)
    _assert_close(rs, _reduce_scatter(A @ B, 0, "sum"), "after reserve")
    # The ops found everything reserved: nothing grew.
    assert atp.memory_stats(name) == reserved, (atp.memory_stats(name), reserved)
    # An op with nothing to reserve is refused, naming those that have.
    with pytest.raises(atp.InvalidArgumentError, match="is not one of .*fused_all_gather_matmul"):
        atp.reserve(OPS.swiglu_backward, B, torch.cat([B, B], dim=1), name)


def test_reserve(pool2):
    pool2.run(case_reserve)


def case_barrier():
    """asynctp.torch.barrier: the first call makes the group's context; the last rank comes
    0.3 s late and every other rank's barrier holds until it is there (on the CPU backend the
    call returns once the barrier is passed)."""
    import time

    rank, ws = _world()
    group = dist.new_group(list(range(ws)))
    name = group.group_name
    atp.barrier(name, "cpu")
    assert atp.memory_stats(name)["contexts"] == 1
    if rank == ws - 1:
        time.sleep(0.3)
    t0 = time.perf_counter()
    atp.barrier(name, "cpu")
    waited = time.perf_counter() - t0
    atp.barrier(name)  # the group's one context, on the CPU
    assert atp.memory_stats(name)["contexts"] == 1
    bad = _raises(asynctp.InvalidArgumentError, atp.barrier, 7, "cpu")
    dist.destroy_process_group(group)
    return rank == ws - 1 or waited >= 0.15, bad


def test_barrier(pool2, pool4):
    for pool in (pool2, pool4):
        for held, message in pool.run(case_barrier):
            assert held, "a rank passed the barrier before the last one reached it"
            assert "group_name must be a str" in message, message


def case_stats_and_release():
    from asynctp.torch import _contexts

    name = _group_name()
    A, B = _randn((8, 16), torch.float32, 1), _randn((16, 8), torch.float32, 2)
    OPS.fused_all_gather_matmul(A, [B], 0, name)
    path, reason = atp.last_path("all_gather_matmul", name)
    assert path in ("split", "native", "fallback"), (path, reason)
    usage = atp.usage(name)
    assert sum(usage["all_gather_matmul"].values()) >= 1, usage
    stats = atp.memory_stats(name)
    assert stats["contexts"] >= 1 and stats["symmetric_bytes"] > 0, stats
    assert atp.memory_stats()["symmetric_bytes"] >= stats["symmetric_bytes"]
    atp.release(name)
    assert not _contexts.entries(name)
    assert atp.memory_stats(name)["contexts"] == 0
    OPS.fused_all_gather_matmul(A, [B], 0, name)  # a new context, made on first use
    assert len(_contexts.entries(name)) == 1


def test_stats_and_release(pool2):
    pool2.run(case_stats_and_release)


def test_set_options_refuses_bad_values():
    """set_options names a bad value when it is given, and keeps the options as they were: not
    at the next group's first op, where a str timeout times 1000 is a repeated string, a NaN
    has no int, and a negative one would reach the library."""
    from asynctp.torch._contexts import OPTIONS

    before = dict(vars(OPTIONS))
    bad = [{"timeout_s": -1}, {"timeout_s": 0}, {"timeout_s": float("nan")},
           {"timeout_s": float("inf")}, {"timeout_s": "5"}, {"timeout_s": True},
           {"max_workspace_mb": -1}, {"max_workspace_mb": 1.5}, {"max_workspace_mb": "64"},
           {"dispatch_cache": 3}, {"path": "fastest"}]
    for kwargs in bad:
        with pytest.raises(asynctp.InvalidArgumentError):
            atp.set_options(**kwargs)
        assert dict(vars(OPTIONS)) == before, kwargs
    from asynctp.torch import _contexts

    # Any positive timeout is at least a millisecond (never 0 ms, which means the default).
    try:
        atp.set_options(timeout_s=1e-4)
        assert _contexts.timeout_ms() == 1
        atp.set_options(timeout_s=2.5)
        assert _contexts.timeout_ms() == 2500
        atp.set_options()
        assert _contexts.timeout_ms() == 0
    finally:
        for key, value in before.items():
            setattr(OPTIONS, key, value)
