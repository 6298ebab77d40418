"""A GEMM with the bias and the exact (erf) GELU in its epilogue: ``gelu(x @ weight.T + bias)``, the MLP's ``fc1``.

The procedure encoder's MLP runs ``fc1`` (768 -> 3,072 in ``clevr``) and then the GELU as a separate elementwise
pass, which on the 2026-11-26 H100 profile cost 1.37 ms of a batch-32 call (25,088 tokens: the GELU reads and writes
the 3,072-wide activation once more, at ~3 TB/s). cuBLASLt's GELU epilogue removes the pass (it saved 0.81 ms) but is
the tanh approximation, not the model's erf GELU, so it stays opt-in (``gelu_epilogue``). This op is the erf GELU in
the epilogue of a Triton GEMM: the fp32 accumulator of a tile, plus the bias, rounded to the storage dtype (as the
GEMM's output is), then ``x * 0.5 * (1 + erf(x / sqrt(2)))`` in fp32 (PyTorch's own formula and order) and rounded
again: the readable path's two roundings, with only the GEMM's summation order differing.

Tiles: ``BLOCK_M`` x ``BLOCK_N`` outputs per program over ``BLOCK_K`` steps of K, programs ordered in groups of
``GROUP_M`` row tiles so that the weight tiles of a column band are read from L2 while the group shares them. The
tile sizes are starting points for sm_90 (bf16: 128 x 128 x 64, 8 warps, 3 stages: wgmma), untuned until a GPU times them
(``bench/gpu_tune.py``, variant ``encoder_gelu_erf_epilogue``). bf16 / fp16 operands go to the tensor cores with fp32
accumulation (exact products, as cuBLAS); fp32 operands use ``input_precision="ieee"`` (no TF32, as the reference
with PyTorch's default ``allow_tf32=False``). Under the interpreter, whose bf16 arithmetic is wrong, operands are
widened to fp32 before the dot (exact, since bf16 / fp16 products are exact in fp32).

:func:`bias_gelu_erf` (the epilogue) and :func:`dot_rows_by_weight` (the tile's K loop) are also the decoding step's
MLP kernel's (``procap.kernels.decode_mlp``): one definition of each.

Forward only (inference): with an input that requires grad the dispatch runs the reference, ``F.gelu(F.linear(...))``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from procap.kernels._common import as_stored
from procap.kernels.dispatch import INTERPRETED, FusedOp, register, require_triton_tensor, run, tl, triton, triton_jit

# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages) for bf16 / fp16 and for fp32 operands: sm_90 starting points (the
# fp32 dot runs on FMA units and needs a shorter K step to stay clear of spills); small tiles under the interpreter,
# whose cost is per program and whose tests use small shapes that should still span several tiles.
GEMM_TILES_HALF = (32, 32, 32, 4, 1) if INTERPRETED else (128, 128, 64, 8, 3)
GEMM_TILES_FP32 = (32, 32, 32, 4, 1) if INTERPRETED else (64, 128, 16, 8, 2)
GROUP_M = 8  # row tiles sharing a column band of the weight while it is in L2


def linear_gelu_ref(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """Reference: ``F.gelu(F.linear(x, weight, bias))``, the readable MLP's ``activation(fc1(x))`` (erf GELU).

    Args:
        x: (M, K) activations; weight: (N, K), ``nn.Linear``'s layout; bias: (N,). One dtype for all three.

    Returns:
        (M, N) in x's dtype.
    """
    return F.gelu(F.linear(x, weight, bias))


@triton_jit
def bias_gelu_erf(acc, Bias_ptr, cols, col_ok, like_ptr, ROUND_BF16: tl.constexpr):
    """fp32 tile ``acc`` (rows, cols) + bias, rounded to ``like_ptr``'s dtype as the GEMM's output is, then the erf
    GELU in fp32 (PyTorch's formula and order) rounded again, as the separate GELU leaves it; returned in fp32."""
    pre = as_stored(
        acc + tl.load(Bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :], like_ptr, ROUND_BF16
    )
    return as_stored(pre * 0.5 * (1.0 + tl.math.erf(pre * 0.7071067811865476)), like_ptr, ROUND_BF16)


@triton_jit
def dot_rows_by_weight(
    X_ptr,
    row_offsets,
    row_ok,
    W_ptr,
    col_offsets,
    col_ok,
    K,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    WIDEN: tl.constexpr,
):
    """``x[rows] @ weight[cols].T`` as an fp32 (BLOCK_M, BLOCK_N) tile: x and weight rows are K contiguous values
    starting at ``row_offsets`` / ``col_offsets``. ``WIDEN``: operands to fp32 first, and an exact fp32 dot."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < K
        a = tl.load(X_ptr + row_offsets[:, None] + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(W_ptr + col_offsets[None, :] + ks[:, None], mask=col_ok[None, :] & k_ok[:, None], other=0.0)
        if WIDEN:
            acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(a, b, acc)
    return acc


@triton_jit
def _linear_gelu_kernel(
    X_ptr,
    W_ptr,
    Bias_ptr,
    Out_ptr,
    M,
    N,
    K,
    WIDEN: tl.constexpr,
    ROUND_BF16: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    """One (BLOCK_M, BLOCK_N) output tile: the K loop, then the bias + erf GELU epilogue, stored once."""
    pid = tl.program_id(0)
    tiles_n = tl.cdiv(N, BLOCK_N)
    band = GROUP_M * tiles_n  # programs of one group of row tiles, walking the columns together
    first_m = (pid // band) * GROUP_M
    group_rows = tl.minimum(tl.cdiv(M, BLOCK_M) - first_m, GROUP_M)
    tile_m = first_m + (pid % band) % group_rows
    tile_n = (pid % band) // group_rows
    rows = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok, col_ok = rows < M, cols < N
    rows64, cols64 = rows.to(tl.int64), cols.to(tl.int64)
    acc = dot_rows_by_weight(X_ptr, rows64 * K, row_ok, W_ptr, cols64 * K, col_ok, K, BLOCK_M, BLOCK_N, BLOCK_K, WIDEN)
    out = bias_gelu_erf(acc, Bias_ptr, cols, col_ok, Out_ptr, ROUND_BF16)
    tl.store(
        Out_ptr + rows64[:, None] * N + cols64[None, :],
        out.to(Out_ptr.dtype.element_ty),
        mask=row_ok[:, None] & col_ok[None, :],
    )


def widen_operands(dtype: torch.dtype) -> bool:
    """Whether a kernel's dot widens its operands to fp32 (exact): fp32 itself, and bf16 / fp16 under the
    interpreter, whose half-precision arithmetic is wrong."""
    return dtype == torch.float32 or INTERPRETED


def linear_gelu_triton(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """Triton version of :func:`linear_gelu_ref`: one launch, the (M, N) output written once."""
    if x.dim() != 2 or weight.dim() != 2 or weight.shape[1] != x.shape[1] or bias.shape != weight.shape[:1]:
        raise ValueError(
            f"linear_gelu takes x (M, K), weight (N, K) and bias (N,), got {tuple(x.shape)}, {tuple(weight.shape)} "
            f"and {tuple(bias.shape)}"
        )
    if weight.dtype != x.dtype or bias.dtype != x.dtype:
        raise ValueError(f"linear_gelu: x, weight and bias in one dtype, got {x.dtype}, {weight.dtype}, {bias.dtype}")
    require_triton_tensor(x, "linear + GELU")
    (m, k), n = x.shape, weight.shape[0]
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    block_m, block_n, block_k, warps, stages = GEMM_TILES_FP32 if x.dtype == torch.float32 else GEMM_TILES_HALF
    grid = (triton.cdiv(m, block_m) * triton.cdiv(n, block_n),)
    _linear_gelu_kernel[grid](
        x.contiguous(),
        weight.contiguous(),
        bias.contiguous(),
        out,
        m,
        n,
        k,
        WIDEN=widen_operands(x.dtype),
        ROUND_BF16=INTERPRETED and x.dtype == torch.bfloat16,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        GROUP_M=GROUP_M,
        num_warps=warps,
        num_stages=stages,
    )
    return out


# ----------------------------------------------------------------------------------------------- dispatch
LINEAR_GELU = register(FusedOp("linear_gelu", linear_gelu_ref, linear_gelu_triton, differentiable=False))


def linear_gelu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, impl: str | None = None) -> torch.Tensor:
    """``gelu(x @ weight.T + bias)`` (erf GELU) in one Triton GEMM on CUDA; the reference elsewhere.

    Args:
        x: (M, K); weight: (N, K); bias: (N,); one dtype.
        impl: None (automatic) or ``"reference"`` / ``"triton"``.
    """
    if torch.compiler.is_compiling():  # the Captioner's torch_compile: Inductor fuses the GELU into its own GEMM
        return linear_gelu_ref(x, weight, bias)
    requires_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (x, weight, bias))
    return run("linear_gelu", impl, x, requires_grad, x, weight, bias)
