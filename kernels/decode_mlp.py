"""The decoding step's MLP in one launch: ``fc2(gelu(fc1(x)))`` for the B rows of one new token each.

At decoding sizes (B = 1..128 rows; the ``clevr`` decoder: 512 -> 2,048 -> 512) the MLP is three latency-bound
launches per layer and step: the fc1 GEMM, the GELU, the fc2 GEMM (at batch 32 the step's 288 GEMM launches per call
take about 6.6 us each, by the 2026-11-26 H100 profile in the table of issue 51). This kernel does the three in one
launch and keeps the hidden activation on chip. The residual add stays where the step does it, fused with the next
LayerNorm (``procap.kernels.add_layer_norm``), so this op returns fc2's output.

The split: program (row block, hidden slice) owns ``ROW_BLOCK`` rows (16, the smallest ``tl.dot`` tile) and
``HIDDEN_PER_PROGRAM`` hidden units. It computes its slice of fc1 (+ bias, erf GELU: the hidden values, rounded as
the readable path stores them, never leave the program) and that slice's contribution to fc2, an fp32 (rows, D)
partial product, stored in a workspace. So every weight is read once per row block, and the grid has
``ceil(B / 16) x ceil(F / 128)`` programs (32 at batch 32 in ``clevr``), each reading 256 KB of weights, instead of
one program streaming all 4 MB. Splitting fc2's output columns instead would recompute fc1 per column tile.

The partials are summed deterministically: each program, after storing its partial, takes a ticket from its row
block's counter (an atomic add with release / acquire semantics, after a barrier so that every thread's stores come
before it); the program that draws the last ticket loads the row block's partials a (splits, rows, columns) block
at a time and sums them over the splits in one fixed order, whatever order the programs finished in, adds fc2's
bias, rounds once to the output dtype and resets the counter to zero for the next launch, so a CUDA graph replays it
without a reset of its own. No float atomics: the output is the same bits on every run. That summing program reads
splits x 16 x D fp32 values alone (512 KB at batch 32 in ``clevr``): if a GPU shows it dominating, a second launch
summing in parallel (two launches instead of three) is the alternative.

Contract: ``fc2(gelu(fc1(x)))`` as ``F.linear`` / ``F.gelu`` (erf) compute it, which is what the step ran before
(:func:`decode_mlp_ref`); the hidden activation rounded to x's dtype after the bias and after the GELU, as the
readable path stores it; only the GEMMs' fp32 summation order differs. ``partials`` / ``counters`` are the Triton
path's workspace (:func:`decode_mlp_workspace`, made once by the caller, counters zero); the reference leaves them.
Forward only.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from procap.kernels._common import as_stored
from procap.kernels.dispatch import INTERPRETED, FusedOp, register, require_triton_tensor, run, tl, triton, triton_jit
from procap.kernels.linear_gelu import bias_gelu_erf, dot_rows_by_weight, widen_operands

ROW_BLOCK = 16  # rows per program: tl.dot's smallest tile; masked rows are neither loaded nor stored
# Hidden units per program, then (fc1's K step, fc2's column step) for bf16 / fp16 and for fp32 operands: the widest
# steps that compile without spills for sm_90 under both CI's Triton (3.9) and the GPU image's (3.6), whose fp32 dot
# (FMA units) takes ~200 registers there. Small under the interpreter, so that the tests' shapes span several of each.
HIDDEN_PER_PROGRAM = 32 if INTERPRETED else 128
STEPS_HALF = (16, 32) if INTERPRETED else (64, 64)
STEPS_FP32 = (16, 32)  # the same under the interpreter
# Partial values the last program loads at once while summing: 64 fp32 registers a thread at 4 warps (fewer under
# the interpreter, so that the tests' sums take several steps)
REDUCE_ELEMENTS = 256 if INTERPRETED else 8192


def decode_mlp_splits(hidden: int) -> int:
    """Hidden slices (programs per row block) for ``hidden`` units."""
    return -(-hidden // HIDDEN_PER_PROGRAM)


def decode_mlp_workspace(
    batch: int, dim: int, hidden: int, device: torch.device | str
) -> tuple[torch.Tensor, torch.Tensor]:
    """The Triton path's workspace for ``batch`` rows: fp32 partials (splits, batch, dim) and the row blocks' int32
    counters, zero (each launch leaves them zero again)."""
    partials = torch.zeros(decode_mlp_splits(hidden), batch, dim, dtype=torch.float32, device=device)
    return partials, torch.zeros(-(-batch // ROW_BLOCK), dtype=torch.int32, device=device)


def decode_mlp_ref(
    x: torch.Tensor,
    fc1_weight: torch.Tensor,
    fc1_bias: torch.Tensor,
    fc2_weight: torch.Tensor,
    fc2_bias: torch.Tensor,
    partials: torch.Tensor,
    counters: torch.Tensor,
) -> torch.Tensor:
    """Reference: ``F.linear(F.gelu(F.linear(x, fc1_weight, fc1_bias)), fc2_weight, fc2_bias)``.

    Args:
        x: (B, D); fc1_weight (F, D), fc1_bias (F,), fc2_weight (D, F), fc2_bias (D,): ``nn.Linear``'s layout, x's
            dtype. partials, counters: :func:`decode_mlp_workspace` (not used here).

    Returns:
        (B, D) in x's dtype.
    """
    return F.linear(F.gelu(F.linear(x, fc1_weight, fc1_bias)), fc2_weight, fc2_bias)


@triton_jit
def _store_partial(
    hidden, W2_ptr, Partial_ptr, rows, row_ok, hidden_cols, f_ok, D, HIDDEN, BLOCK_N: tl.constexpr, WIDEN: tl.constexpr
):
    """This slice's fc2 contribution ``hidden @ W2[:, slice].T``, (rows, D) in fp32, into its partial buffer."""
    for n0 in range(0, D, BLOCK_N):
        cols = n0 + tl.arange(0, BLOCK_N)
        col_ok = cols < D
        w2 = tl.load(
            W2_ptr + cols[None, :] * HIDDEN + hidden_cols[:, None], mask=f_ok[:, None] & col_ok[None, :], other=0.0
        )
        if WIDEN:
            part = tl.dot(hidden.to(tl.float32), w2.to(tl.float32), input_precision="ieee")
        else:
            part = tl.dot(hidden.to(w2.dtype), w2)
        tl.store(Partial_ptr + rows[:, None] * D + cols[None, :], part, mask=row_ok[:, None] & col_ok[None, :])


@triton_jit
def _sum_partials(
    Partials_ptr,
    B2_ptr,
    Out_ptr,
    row_block,
    M,
    D,
    SPLITS,
    ROUND_BF16: tl.constexpr,
    BLOCK_M: tl.constexpr,
    SPLITS_P2: tl.constexpr,
    R_ROWS: tl.constexpr,
    BLOCK_R: tl.constexpr,
):
    """The last program of a row block: its rows' partials summed over the splits, fc2's bias added, rounded once.

    Each step loads a whole (splits, R_ROWS, BLOCK_R) block at once and sums it over its first axis (a fixed tree
    order, the same bits every run): a loop over the splits would wait for one L2 round trip per split.
    """
    splits = tl.arange(0, SPLITS_P2)
    split_offsets = (splits * M * D).to(tl.int64)[:, None, None]
    for r0 in range(0, tl.minimum(BLOCK_M, M - row_block * BLOCK_M), R_ROWS):
        rows = (row_block * BLOCK_M + r0 + tl.arange(0, R_ROWS)).to(tl.int64)
        for n0 in range(0, D, BLOCK_R):
            cols = n0 + tl.arange(0, BLOCK_R)
            ok = (rows < M)[:, None] & (cols < D)[None, :]
            offsets = rows[:, None] * D + cols[None, :]
            mask = (splits < SPLITS)[:, None, None] & ok[None, :, :]
            # L1 bypassed (.cg): the other programs of the row block wrote these from other SMs
            parts = tl.load(
                Partials_ptr + split_offsets + offsets[None, :, :], mask=mask, other=0.0, cache_modifier=".cg"
            )
            total = tl.sum(parts, axis=0) + tl.load(B2_ptr + cols, mask=cols < D, other=0.0).to(tl.float32)[None, :]
            tl.store(Out_ptr + offsets, as_stored(total, Out_ptr, ROUND_BF16).to(Out_ptr.dtype.element_ty), mask=ok)


@triton_jit
def _decode_mlp_kernel(
    X_ptr,
    W1_ptr,
    B1_ptr,
    W2_ptr,
    B2_ptr,
    Out_ptr,
    Partials_ptr,
    Counters_ptr,
    M,
    D,
    HIDDEN,
    WIDEN: tl.constexpr,
    ROUND_BF16: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_F: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SPLITS_P2: tl.constexpr,
    R_ROWS: tl.constexpr,
    BLOCK_R: tl.constexpr,
):
    """Program (row block, hidden slice): fc1 + GELU of the slice, its fc2 partial; the last of a row block sums."""
    row_block, split, splits = tl.program_id(0), tl.program_id(1), tl.num_programs(1)
    rows = (row_block * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    units = (split * BLOCK_F + tl.arange(0, BLOCK_F)).to(tl.int64)
    row_ok, f_ok = rows < M, units < HIDDEN
    acc = dot_rows_by_weight(X_ptr, rows * D, row_ok, W1_ptr, units * D, f_ok, D, BLOCK_M, BLOCK_F, BLOCK_K, WIDEN)
    hidden = bias_gelu_erf(acc, B1_ptr, units, f_ok, X_ptr, ROUND_BF16)
    _store_partial(hidden, W2_ptr, Partials_ptr + split * M * D, rows, row_ok, units, f_ok, D, HIDDEN, BLOCK_N, WIDEN)
    tl.debug_barrier()  # every thread's partial stored before the ticket releases them
    ticket = tl.atomic_add(Counters_ptr + row_block, 1, sem="acq_rel")
    if ticket == splits - 1:
        _sum_partials(
            Partials_ptr, B2_ptr, Out_ptr, row_block, M, D, splits, ROUND_BF16, BLOCK_M, SPLITS_P2, R_ROWS, BLOCK_R
        )
        tl.store(Counters_ptr + row_block, 0)  # every program of this launch has drawn: ready for the next


def _check(x: torch.Tensor, weights: tuple[torch.Tensor, ...], partials: torch.Tensor, counters: torch.Tensor) -> None:
    """Refuse arguments that do not fit together, naming them (a launch would read out of bounds)."""
    fc1_weight, fc1_bias, fc2_weight, fc2_bias = weights
    (batch, dim), hidden = x.shape, fc1_weight.shape[0]
    shapes = (fc1_weight.shape, fc1_bias.shape, fc2_weight.shape, fc2_bias.shape)
    if shapes != ((hidden, dim), (hidden,), (dim, hidden), (dim,)):
        raise ValueError(f"decode_mlp: x (B, D), fc1 (F, D) + (F,) and fc2 (D, F) + (D,) must fit, got {shapes}")
    if any(t.dtype != x.dtype for t in weights):
        raise ValueError(f"decode_mlp: the weights must be in x's dtype ({x.dtype})")
    want = (decode_mlp_splits(hidden), batch, dim)
    if partials.shape != want or partials.dtype != torch.float32 or counters.shape != (-(-batch // ROW_BLOCK),):
        raise ValueError(f"decode_mlp: the workspace must be decode_mlp_workspace({batch}, {dim}, {hidden})'s")
    if counters.dtype != torch.int32 or not all(t.is_contiguous() for t in (x, partials, counters, *weights)):
        raise ValueError("decode_mlp reads and writes contiguous buffers, the counters int32")


def _tiles(batch: int, dim: int, splits: int, dtype: torch.dtype) -> dict[str, int]:
    """The kernel's tile constants: its row block and hidden slice, fc1's K step and fc2's column step for ``dtype``,
    and the shape of the block the last program sums at once ((splits, rows, columns), ``REDUCE_ELEMENTS`` at most,
    rows no more than the batch has)."""
    block_k, block_n = STEPS_FP32 if dtype == torch.float32 else STEPS_HALF
    splits_p2, reduce_rows = triton.next_power_of_2(splits), min(ROW_BLOCK, triton.next_power_of_2(batch))
    reduce_columns = max(1, min(triton.next_power_of_2(dim), REDUCE_ELEMENTS // (splits_p2 * reduce_rows)))
    return {
        "BLOCK_M": ROW_BLOCK,
        "BLOCK_F": HIDDEN_PER_PROGRAM,
        "BLOCK_K": block_k,
        "BLOCK_N": block_n,
        "SPLITS_P2": splits_p2,
        "R_ROWS": reduce_rows,
        "BLOCK_R": reduce_columns,
    }


def decode_mlp_triton(
    x: torch.Tensor,
    fc1_weight: torch.Tensor,
    fc1_bias: torch.Tensor,
    fc2_weight: torch.Tensor,
    fc2_bias: torch.Tensor,
    partials: torch.Tensor,
    counters: torch.Tensor,
) -> torch.Tensor:
    """Triton version of :func:`decode_mlp_ref`: one launch, no host sync (module docstring)."""
    _check(x, (fc1_weight, fc1_bias, fc2_weight, fc2_bias), partials, counters)
    require_triton_tensor(x, "decode MLP")
    (batch, dim), hidden = x.shape, fc1_weight.shape[0]
    out = torch.empty_like(x)
    splits = decode_mlp_splits(hidden)
    _decode_mlp_kernel[(triton.cdiv(batch, ROW_BLOCK), splits)](
        x,
        fc1_weight,
        fc1_bias,
        fc2_weight,
        fc2_bias,
        out,
        partials,
        counters,
        batch,
        dim,
        hidden,
        WIDEN=widen_operands(x.dtype),
        ROUND_BF16=INTERPRETED and x.dtype == torch.bfloat16,
        **_tiles(batch, dim, splits, x.dtype),
        num_warps=4,
    )
    return out


# ----------------------------------------------------------------------------------------------- dispatch
DECODE_MLP = register(FusedOp("decode_mlp", decode_mlp_ref, decode_mlp_triton, differentiable=False))


def decode_mlp(
    x: torch.Tensor,
    fc1_weight: torch.Tensor,
    fc1_bias: torch.Tensor,
    fc2_weight: torch.Tensor,
    fc2_bias: torch.Tensor,
    partials: torch.Tensor,
    counters: torch.Tensor,
    impl: str | None = None,
) -> torch.Tensor:
    """The decoding step's ``fc2(gelu(fc1(x)))`` in one Triton launch on CUDA; the reference elsewhere.

    Args:
        x: (B, D); the weights in ``nn.Linear``'s layout and x's dtype; partials, counters: the workspace of
            :func:`decode_mlp_workspace` for B rows.
        impl: None (automatic) or ``"reference"`` / ``"triton"``.
    """
    args = (x, fc1_weight, fc1_bias, fc2_weight, fc2_bias, partials, counters)
    requires_grad = torch.is_grad_enabled() and any(t.requires_grad for t in args[:5])
    return run("decode_mlp", impl, x, requires_grad, *args)
