"""The decoding step's fp32 logits and greedy pick in one kernel, then the greedy bookkeeping reducing its tiles.

The cached step (``procap.model.decoder_step``) ends with the fp32 output projection, one (B, D) x (D, V) GEMM, and
``procap.kernels.greedy_step``, which finds each row's first maximum and does the EOS bookkeeping. At decoding sizes
the GEMM is tiny (the ``clevr`` decoder: 80 x 512) and cuBLAS's pick for it ran 15 us a step on an H100 (24 launches
per caption, ``sgemm_largek``), while a GEMV of that size reads 160 KB from L2. This op replaces the GEMM by one
Triton launch and hands the pick to it:

- ``_logits_tile_pick_kernel``, one program per (batch row, tile of ``TILE_ROWS`` vocabulary rows): the dot
  products in fp32 (the weights loaded in their dtype and widened, exact for bf16 / fp16), plus the bias (0 or
  -inf), written as the logits, then the tile's maximum and its first index;
- ``procap.kernels.greedy.greedy_step_triton`` given those (B, tiles) maxima and indices as candidates: its running
  first maximum over the tiles picks the lowest tile holding the row maximum, and that tile's first index, so ties go
  to the lowest vocabulary index as ``torch.argmax`` breaks them; then its bookkeeping as it always does.

Two launches a step, as before (GEMM + pick); what changes is the GEMM kernel and the pick reading B x tiles values
instead of B x V. A single launch (the last program of a row finishing the pick) would need a counter reset in every
graph replay and a copy of the bookkeeping; the two-stage split keeps one bookkeeping kernel.

Contract (every implementation, in place): ``logits = hidden @ weight.T + bias`` in fp32 (``weight`` (V, D) widened
to fp32), then :func:`procap.kernels.greedy.greedy_step_ref` on those logits. ``tile_max`` / ``tile_index``
(B, :func:`logits_tiles` (V)) are the Triton path's workspace, made once by the caller; the reference leaves them.
The logits differ from the reference's in the summation order only (fp32 rounding); integer-valued inputs give equal
logits and equal picks, ties included. Forward only.
"""

from __future__ import annotations

import torch

from procap.kernels.dispatch import FusedOp, register, run, tl, triton, triton_can_take, triton_jit
from procap.kernels.greedy import greedy_step_ref, greedy_step_triton

TILE_ROWS = 32  # vocabulary rows per program: the clevr vocabulary (80) is 3 tiles, 96 programs at batch 32
BLOCK_DIM = 128  # hidden dimensions per loop iteration: a 32 x 128 fp32 tile is 32 registers a thread at 4 warps


def logits_tiles(vocab: int) -> int:
    """Columns of the ``tile_max`` / ``tile_index`` workspace for a vocabulary of ``vocab`` ids."""
    return -(-vocab // TILE_ROWS)


def greedy_logits_step_ref(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    logits: torch.Tensor,
    tile_max: torch.Tensor,
    tile_index: torch.Tensor,
    finished: torch.Tensor,
    tokens: torch.Tensor,
    out: torch.Tensor,
    pos: torch.Tensor,
    x: torch.Tensor,
    mask: torch.Tensor,
    embed: torch.Tensor,
    pos_embed: torch.Tensor,
) -> None:
    """Reference: the fp32 GEMM into ``logits``, then :func:`~procap.kernels.greedy.greedy_step_ref` (the step's
    path before this op). ``tile_max`` / ``tile_index`` are not used.

    Args:
        hidden: (B, D) fp32, the final norm's output. weight: (V, D), any float dtype. bias: (V,) fp32.
        logits: (B, V) fp32, written. The rest: as :func:`~procap.kernels.greedy.greedy_step_ref`.
    """
    torch.addmm(bias, hidden, weight.float().t(), out=logits)
    greedy_step_ref(logits, finished, tokens, out, pos, x, mask, embed, pos_embed)


@triton_jit
def _logits_tile_pick_kernel(
    Hidden_ptr,
    Weight_ptr,
    Bias_ptr,
    Logits_ptr,
    TileMax_ptr,
    TileIndex_ptr,
    V,
    D,
    TILES,
    TILE_V: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """Program (row, tile): ``TILE_V`` logits of one row, written, and their first maximum."""
    row = tl.program_id(0).to(tl.int64)
    tile = tl.program_id(1)
    cols = tile * TILE_V + tl.arange(0, TILE_V)
    col_ok = cols < V
    acc = tl.zeros((TILE_V,), dtype=tl.float32)
    for d0 in range(0, D, BLOCK_D):
        dims = d0 + tl.arange(0, BLOCK_D)
        dim_ok = dims < D
        h = tl.load(Hidden_ptr + row * D + dims, mask=dim_ok, other=0.0)
        ok = col_ok[:, None] & dim_ok[None, :]
        w = tl.load(Weight_ptr + cols[:, None] * D + dims[None, :], mask=ok, other=0.0).to(tl.float32)
        acc += tl.sum(w * h[None, :], axis=1)
    scores = acc + tl.load(Bias_ptr + cols, mask=col_ok, other=0.0)
    tl.store(Logits_ptr + row * V + cols, scores, mask=col_ok)
    scores = tl.where(col_ok, scores, float("-inf"))  # columns past V come after every real one: never first
    first = tl.argmax(scores, axis=0, tie_break_left=True)
    tl.store(TileMax_ptr + row * TILES + tile, tl.max(scores, axis=0))
    tl.store(TileIndex_ptr + row * TILES + tile, (tile * TILE_V + first).to(tl.int64))


def greedy_logits_step_triton(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    logits: torch.Tensor,
    tile_max: torch.Tensor,
    tile_index: torch.Tensor,
    finished: torch.Tensor,
    tokens: torch.Tensor,
    out: torch.Tensor,
    pos: torch.Tensor,
    x: torch.Tensor,
    mask: torch.Tensor,
    embed: torch.Tensor,
    pos_embed: torch.Tensor,
) -> None:
    """Triton version of :func:`greedy_logits_step_ref`: two launches, no host sync (module docstring)."""
    batch, dim = hidden.shape
    vocab, tiles = weight.shape[0], logits_tiles(weight.shape[0])
    if hidden.dtype != torch.float32 or logits.dtype != torch.float32 or bias.dtype != torch.float32:
        raise ValueError("greedy_logits_step: hidden, bias and logits must be fp32")
    if weight.shape[1] != dim or logits.shape != (batch, vocab) or bias.shape != (vocab,):
        raise ValueError("greedy_logits_step: hidden (B, D), weight (V, D), bias (V,) and logits (B, V) must fit")
    if tile_max.shape != (batch, tiles) or tile_index.shape != (batch, tiles) or tile_index.dtype != torch.long:
        raise ValueError(f"greedy_logits_step: tile_max and tile_index (int64) must be ({batch}, {tiles})")
    if not all(t.is_contiguous() for t in (hidden, weight, bias, logits, tile_max, tile_index)):
        raise ValueError("greedy_logits_step reads and writes contiguous buffers")
    if not triton_can_take(hidden):
        raise ValueError(f"the Triton logits pick needs CUDA tensors, got {hidden.device}")
    _logits_tile_pick_kernel[(batch, tiles)](
        hidden,
        weight,
        bias,
        logits,
        tile_max,
        tile_index,
        vocab,
        dim,
        tiles,
        TILE_V=TILE_ROWS,
        BLOCK_D=min(triton.next_power_of_2(dim), BLOCK_DIM),
        num_warps=4,
    )
    greedy_step_triton(tile_max, finished, tokens, out, pos, x, mask, embed, pos_embed, candidates=tile_index)


# ----------------------------------------------------------------------------------------------- dispatch
GREEDY_LOGITS_STEP = register(
    FusedOp(
        "greedy_logits_step",
        greedy_logits_step_ref,
        greedy_logits_step_triton,
        dtypes=(torch.float32,),
        differentiable=False,
    )
)


def greedy_logits_step(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    logits: torch.Tensor,
    tile_max: torch.Tensor,
    tile_index: torch.Tensor,
    finished: torch.Tensor,
    tokens: torch.Tensor,
    out: torch.Tensor,
    pos: torch.Tensor,
    x: torch.Tensor,
    mask: torch.Tensor,
    embed: torch.Tensor,
    pos_embed: torch.Tensor,
    impl: str | None = None,
) -> None:
    """The step's logits, pick and bookkeeping (module docstring): two Triton launches on CUDA, the reference
    (the GEMM and the greedy step's reference) elsewhere."""
    args = (hidden, weight, bias, logits, tile_max, tile_index, finished, tokens, out, pos, x, mask, embed, pos_embed)
    run("greedy_logits_step", impl, hidden, False, *args)
