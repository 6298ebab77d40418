"""The fused GroupNorm's opt-in paths (issue 51): the persistent statistics kernel, the parallel finalize and the
single-kernel path, against ``group_norm_ref`` (fp64 truth) and against the default chunked Triton path; and the pure
functions that size them (occupancy, chunking, tilings)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from procap import kernels
from procap.kernels import groupnorm
from procap.kernels.groupnorm import (
    _finalize_tiles,
    _forward_finalize,
    _forward_partial_stats,
    _Inputs,
    _persistent_partial_stats,
    _Tiling,
    finalize_tiling,
    group_norm_fwd,
    group_norm_ref,
    persistent_chunks,
    single_kernel_tiling,
)
from procap.kernels.occupancy import (
    HOPPER,
    SMLimits,
    ctas_from_compiled,
    resident_ctas,
    resident_programs,
    sm_resources,
)
from tests.support import DTYPES, impl_device, max_abs_err, requires_triton

NEW_PATHS = ["persistent", "single_kernel"]
# Batch 1; H*W not a multiple of any tile (63, 65, 143); 3 channels per group (not a power of two), one, six; H*W = 1.
SHAPES = [((1, 64, 7, 9), 32), ((2, 96, 5, 13), 32), ((3, 32, 3, 3), 32), ((1, 24, 5, 13), 4), ((2, 128, 1, 1), 32)]
# (residual, in_bias, return_sum): the VQGAN's modes.
MODES = [(False, False, False), (True, False, False), (False, True, False), (False, True, True), (True, True, False)]

pytestmark = [
    pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning"),  # the interpreter's sigmoid
    pytest.mark.usefixtures("fresh_dispatch"),
]


def _inputs(shape, dtype, residual, in_bias, requires_grad=False, offset=5.0):
    device = impl_device("triton")
    x = (torch.randn(shape, device=device) * 3 + offset).to(dtype).contiguous(memory_format=torch.channels_last)
    r = torch.randn(shape, device=device).to(dtype).contiguous(memory_format=torch.channels_last) if residual else None
    ib = torch.randn(shape[1], device=device) * 4 if in_bias else None
    weight, bias = torch.randn(shape[1], device=device), torch.randn(shape[1], device=device)
    for t in (x, r, ib, weight, bias):
        if t is not None:
            t.requires_grad_(requires_grad)
    return x, r, ib, weight, bias


def _listed(out) -> list[torch.Tensor]:
    return list(out) if isinstance(out, tuple) else [out]


def _tolerance(dtype: torch.dtype, like: torch.Tensor) -> float:
    """Two statistics that differ in fp32 summation order give outputs apart by at most a rounding of the dtype."""
    if dtype == torch.float32:
        return 2e-5
    return 2 * torch.finfo(dtype).eps * like.abs().max().item()


# -- the pure functions ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "registers,warps,shared,ctas",
    [
        (128, 8, 4096, 2),  # the statistics kernel as the issue found it: 2 CTAs of 8 warps, not 8
        (169, 8, 0, 1),  # fp32 with a residual: 176 registers a thread after rounding, 11 warps fit
        (64, 4, 0, 8),  # registers bound: 32 warps
        (32, 4, 0, 16),  # threads bound: 2048 / 128
        (16, 1, 0, 32),  # CTA slots bound
        (32, 4, 100 * 1024, 2),  # shared memory bound: 228 KB / (100 KB + 1 KB reserved)
        (255, 16, 0, 1),  # 8 warps fit: never 0 for a kernel that launches
    ],
)
def test_resident_ctas(registers, warps, shared, ctas):
    assert resident_ctas(registers, warps, shared) == ctas


def test_resident_ctas_reads_the_limits_given():
    ampere_like = SMLimits(registers=65536, threads=1536, shared_bytes=100 * 1024, ctas=16)
    assert resident_ctas(32, 4, 0, ampere_like) == 12  # threads: 1536 / 128
    assert resident_ctas(32, 4, 0, HOPPER) == 16


def test_ctas_from_compiled_kernel_metadata_or_the_fallback():
    loaded = []
    metadata = SimpleNamespace(num_warps=8, shared=0)
    compiled = SimpleNamespace(name="k", n_regs=128, n_spills=0, metadata=metadata)
    compiled._init_handles = lambda: loaded.append(True)
    assert ctas_from_compiled(compiled, HOPPER, fallback=5) == 2
    assert loaded == [True]  # n_regs is read after the binary is loaded
    assert ctas_from_compiled(None, HOPPER, fallback=5) == 5  # interpreter, compile check: nothing compiled


def test_resident_programs_off_cuda_use_the_fallback_and_compile_nothing():
    class Kernel:
        def warmup(self, *args, **kwargs):
            raise AssertionError("no kernel is compiled off CUDA")

    sms, limits = sm_resources(torch.device("cpu"))
    assert (sms, limits) == (132, HOPPER)
    x = torch.empty(4, 8)
    assert resident_programs(Kernel(), (x, 7, 16), {"num_warps": 8}, x.device, fallback_ctas=3) == 3 * 132


@pytest.mark.parametrize(
    "batch,c_tiles,hw,programs,rows,chunks",
    [
        # b32 at level 0 (64 images x 224^2 rows, 64-row tiles, 2 CTAs on 132 SMs): four chunks of 196 tiles,
        # 256 items, one round: 197 tile-costs for the busiest program against 190 for a perfect share.
        (64, 1, 224 * 224, 264, 196 * 64, 4),
        # b1 at level 0: 131 chunks of 6 tiles, 262 items for 264 programs.
        (2, 1, 224 * 224, 264, 6 * 64, 131),
        # level 4 at b32 (512 channels: 4 tiles, 196 rows): one chunk per image, 256 items.
        (64, 4, 196, 264, 4 * 64, 1),
        # one program: every chunking takes all items in turn, and the fewest pay the least overhead.
        (1, 1, 8 * 64, 1, 8 * 64, 1),
        # as many programs as tiles: one tile per item.
        (1, 1, 8 * 64, 100, 64, 8),
    ],
)
def test_persistent_chunks(batch, c_tiles, hw, programs, rows, chunks):
    assert persistent_chunks(batch, c_tiles, hw, 64, programs) == (rows, chunks)


@pytest.mark.parametrize("hw,block_hw,programs", [(143, 16, 3), (50176, 64, 264), (1, 16, 7), (1000, 64, 1000)])
def test_persistent_chunks_cover_the_rows_once(hw, block_hw, programs):
    rows, chunks = persistent_chunks(3, 2, hw, block_hw, programs)
    assert rows % block_hw == 0 and (chunks - 1) * rows < hw <= chunks * rows


@pytest.mark.parametrize(
    "groups,per_group,expected",
    [(32, 4, (64, 4, 4)), (32, 16, (64, 1, 16)), (32, 3, (64, 4, 4)), (4, 6, (64, 2, 8)), (32, 64, (16, 1, 64))],
)
def test_finalize_tiling(groups, per_group, expected):
    assert finalize_tiling(groups, per_group) == expected


@pytest.mark.parametrize(
    "hw,channels,groups,expected",
    [
        (14 * 14, 512, 32, (256, 1, 16)),  # clevr's level 4 and mid block
        (28 * 28, 256, 32, (1024, 1, 8)),  # level 3
        (56 * 56, 256, 32, None),  # level 2: 4096 rows x 8 channels is over the register budget
        (224 * 224, 128, 32, None),
        (63, 64, 32, (64, 8, 2)),  # eight groups a program: 16 channels a row
        (64 * 64, 32, 32, (4096, 2, 1)),  # the tiny preset's level 0, one channel per group
    ],
)
def test_single_kernel_tiling(hw, channels, groups, expected):
    assert single_kernel_tiling(hw, channels, groups) == expected


# -- the kernels, interpreted on CPU (compiled on a GPU) ------------------------------------------------------------


@requires_triton
@pytest.mark.parametrize("path", NEW_PATHS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape,groups", SHAPES, ids=str)
def test_paths_match_the_reference_and_the_chunked_path(path, dtype, shape, groups):
    x, r, ib, weight, bias = _inputs(shape, dtype, residual=True, in_bias=True)
    got = _listed(kernels.group_norm(x, weight, bias, groups, 1e-6, True, r, "triton", in_bias=ib, path=path))
    chunked = _listed(kernels.group_norm(x, weight, bias, groups, 1e-6, True, r, "triton", in_bias=ib))
    ref = _listed(group_norm_ref(x, weight, bias, groups, 1e-6, True, r, ib))
    truth = _listed(
        group_norm_ref(*(t.double() for t in (x, weight, bias)), groups, 1e-6, True, r.double(), ib.double())
    )
    assert got[0].dtype == dtype and got[0].is_contiguous(memory_format=torch.channels_last)
    assert max_abs_err(got[0], truth[0]) <= 2 * max_abs_err(ref[0], truth[0]) + 2e-5
    assert max_abs_err(got[0], chunked[0]) <= _tolerance(dtype, chunked[0])
    assert torch.equal(got[1], chunked[1]) and torch.equal(got[1], ref[1])  # the sum: the same adds, the same bits


@requires_triton
@pytest.mark.parametrize("path", NEW_PATHS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("residual,in_bias,return_sum", MODES, ids=["x", "x+r", "x+b", "x+b,sum", "x+b+r"])
@pytest.mark.parametrize("silu", [True, False], ids=["silu", "plain"])
def test_every_mode(path, dtype, residual, in_bias, return_sum, silu):
    shape, groups = (2, 64, 7, 9), 32
    x, r, ib, weight, bias = _inputs(shape, dtype, residual, in_bias)
    args = (x, weight, bias, groups, 1e-6, silu, r)
    got = _listed(kernels.group_norm(*args, "triton", in_bias=ib, return_sum=return_sum, path=path))
    chunked = _listed(kernels.group_norm(*args, "triton", in_bias=ib, return_sum=return_sum))
    ref = _listed(group_norm_ref(*args, ib, return_sum))
    assert len(got) == len(ref) == len(chunked)
    for g, c, f in zip(got, chunked, ref):
        assert g.dtype == dtype and g.shape == x.shape
        assert max_abs_err(g, c) <= _tolerance(dtype, c)
        assert max_abs_err(g, f) <= max_abs_err(c, f) + _tolerance(dtype, c)


@requires_triton
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("residual,in_bias,return_sum", MODES, ids=["x", "x+r", "x+b", "x+b,sum", "x+b+r"])
def test_persistent_partials_equal_the_chunked_kernels_bit_for_bit(dtype, residual, in_bias, return_sum):
    # Three programs take the six (sample, chunk) items of two 143-row samples in turn, each item three 16-row
    # tiles with the next one's loads in flight: the same sums in the same order as the chunked grid, so the same
    # partial statistics (what another kernel writing partials must also hold) and the same written sum.
    x, r, ib, *_ = _inputs((2, 64, 13, 11), dtype, residual, in_bias)
    write_sum = residual or return_sum
    chunked_inputs, persistent_inputs = (_Inputs.of(x, r, ib, write_sum) for _ in range(2))
    tiling = _Tiling.plan(x, 16, 48, chunked_inputs.stats_tile, 8)
    expected = _forward_partial_stats(chunked_inputs, tiling)
    persistent_tiling, got = _persistent_partial_stats(persistent_inputs, 16, 48, programs=3)
    assert persistent_tiling == tiling and (tiling.n_chunks, tiling.c_tiles) == (3, 1)
    for a, b in zip(got, expected):
        assert torch.equal(a, b)
    assert torch.equal(persistent_inputs.s, chunked_inputs.s)


@requires_triton
@pytest.mark.parametrize("shape,groups", [((2, 64, 13, 11), 32), ((1, 96, 9, 7), 32), ((2, 24, 9, 7), 4)], ids=str)
def test_parallel_finalize_matches_the_serial_one_and_repeats_exactly(shape, groups):
    # The same partials (many chunks: 16-row chunks), finalized by one program per sample merging one channel per
    # group at a time, and by the grid over (samples, group tiles): equal up to the chunk merge's step, and the
    # parallel one gives the same bits run after run (no atomics, a fixed merge order).
    x, *_, weight, _ = _inputs(shape, torch.float32, False, False)
    inputs = _Inputs.of(x, None, None, False)
    tiling = _Tiling.plan(x, 16, 16, inputs.stats_tile, 8)
    partials = _forward_partial_stats(inputs, tiling)
    serial = _forward_finalize(*partials, weight, groups, 1e-6, tiling)
    parallel = _finalize_tiles(*partials, weight, groups, 1e-6, tiling)
    again = _finalize_tiles(*partials, weight, groups, 1e-6, tiling)
    for a, b, c in zip(parallel, serial, again):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
        assert torch.equal(a, c)


@requires_triton
@pytest.mark.parametrize("path", NEW_PATHS)
def test_a_large_mean_keeps_its_variance(path):
    # A mean 1e4 times the spread: E[x^2] - E[x]^2 would lose every digit in fp32. The persistent path (several
    # items a program, several chunks merged) shifts by each chunk's first row; the single kernel's two passes
    # subtract the mean before squaring.
    x = (torch.randn(2, 64, 13, 11) * 0.01 + 100.0).contiguous(memory_format=torch.channels_last)
    weight, bias = torch.randn(64), torch.randn(64)
    truth = group_norm_ref(x.double(), weight.double(), bias.double(), 32, 1e-6, True)
    sizes = {"block_hw": 16, "rows_per_chunk": 32, "programs": 3} if path == "persistent" else {}
    y = group_norm_fwd(x, weight, bias, 32, 1e-6, True, path=path, **sizes)[0]
    assert max_abs_err(y, truth) < 5e-3


@requires_triton
@pytest.mark.parametrize("path", NEW_PATHS)
def test_statistics_equal_the_chunked_paths(path):
    # What the backward reads: group mean / rstd, channel mean / scale, as the chunked path computes them.
    x, r, ib, weight, bias = _inputs((2, 96, 5, 13), torch.float32, True, True)
    got = group_norm_fwd(x, weight, bias, 32, 1e-6, True, r, in_bias=ib, path=path)
    chunked = group_norm_fwd(x, weight, bias, 32, 1e-6, True, r, in_bias=ib)
    for a, b in zip(got[2:], chunked[2:]):
        assert a.shape == b.shape and a.is_contiguous()
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@requires_triton
@pytest.mark.parametrize("path", NEW_PATHS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gradients_match_the_reference(path, dtype):
    shape, groups = (2, 96, 5, 7), 32
    x, r, ib, weight, bias = _inputs(shape, dtype, True, True, requires_grad=True)
    leaves = [x, weight, bias, r, ib]
    grads_out = [torch.randn(shape, device=x.device) for _ in range(2)]
    outputs = {
        "got": kernels.group_norm(x, weight, bias, groups, 1e-6, True, r, "triton", in_bias=ib, path=path),
        "chunked": kernels.group_norm(x, weight, bias, groups, 1e-6, True, r, "triton", in_bias=ib),
        "ref": group_norm_ref(x, weight, bias, groups, 1e-6, True, r, ib),
    }
    grads = {k: torch.autograd.grad([o.float() for o in out], leaves, grads_out) for k, out in outputs.items()}
    leaves64 = [t.detach().double().requires_grad_(True) for t in leaves]
    truth = group_norm_ref(*leaves64[:3], groups, 1e-6, True, leaves64[3], leaves64[4])
    g_true = torch.autograd.grad(truth, leaves64, [g.double() for g in grads_out])
    for name, a, c, f, t in zip(["x", "weight", "bias", "residual", "in_bias"], *grads.values(), g_true):
        assert a.dtype == f.dtype and a.shape == f.shape, name
        assert max_abs_err(a, t) <= 2 * max_abs_err(f, t) + 1e-5, name
        assert max_abs_err(a, c) <= max(_tolerance(dtype, c), 1e-5) * 4, name


def test_the_paths_are_dispatched_as_ops_with_the_same_reference(monkeypatch):
    x, r, ib, weight, bias = _inputs((1, 32, 3, 3), torch.float32, True, True)
    assert groupnorm.GROUP_NORM_OPS == {
        "chunked": "group_norm",
        "persistent": "group_norm_persistent",
        "single_kernel": "group_norm_single_kernel",
    }
    monkeypatch.setenv("PROCAP_KERNELS", "reference")
    kernels.reset_dispatch()
    for op in groupnorm.GROUP_NORM_OPS.values():
        assert kernels.chosen_impl(op, x.device, x.dtype) == "reference"
    ref = group_norm_ref(x, weight, bias, 32, 1e-6, True, r, ib)
    for path in NEW_PATHS:
        got = kernels.group_norm(x, weight, bias, 32, 1e-6, True, r, in_bias=ib, path=path)
        assert all(torch.equal(a, b) for a, b in zip(got, ref))
    with pytest.raises(ValueError, match="path must be one of chunked, persistent, single_kernel"):
        kernels.group_norm(x, weight, bias, 32, path="fast")
