"""The end of one greedy decoding step in one launch: pick, EOS bookkeeping, and the next step's input.

After the logits, the cached decoding step (``procap.model.decoder_step``) has about ten tiny ops left: argmax, PAD
for finished rows, the finished flags, the output column, the next token, the next position, the next input row
``embed[token] + pos_embed[pos + 1]`` and the self-attention mask entry of the next position. Each is a kernel of a
few microseconds at decoding sizes; this op does them all in one program that loops over the rows, so the position
is read before and advanced after every use in the same program (no other program reads it).

Contract (every implementation, in place): with ``p = pos[0]``,

- ``token = argmax(logits, -1)`` (first maximum; the logits arrive with the suppressed ids at -inf), PAD where
  ``finished``; ``out[:, p] = tokens = token``; ``finished |= token == EOS``;
- ``x = embed[token] + pos_embed[p + 1]`` rounded to x's dtype (the eager add);
- ``mask[p + 1] = 0`` (the additive self-attention mask entry of the next position);
- ``pos += 1``.

Precondition: ``p + 1 < len(pos_embed)`` and ``p + 1 < len(mask)`` (a caption of ``max_len <= len(pos_embed)``
tokens decodes positions ``0 .. max_len - 2``; the lean decoder's mask is longer than that). The reference clamps
instead of checking (a check would be a host read), the kernel skips out-of-range writes.

Forward only; no autograd.
"""

from __future__ import annotations

import torch

from procap.kernels._common import as_stored
from procap.kernels.dispatch import INTERPRETED, FusedOp, register, require_triton_tensor, run, tl, triton, triton_jit

PAD_ID, EOS_ID = 0, 5  # procap.model.decoder's ids (kernels/ does not import the model; a test checks they agree)
BLOCK_ROWS = 16
MAX_BLOCK = 1024


def greedy_step_ref(
    logits: torch.Tensor,
    finished: torch.Tensor,
    tokens: torch.Tensor,
    out: torch.Tensor,
    pos: torch.Tensor,
    x: torch.Tensor,
    mask: torch.Tensor,
    embed: torch.Tensor,
    pos_embed: torch.Tensor,
) -> None:
    """Reference: the contract above in plain PyTorch ops, in place.

    Args:
        logits: (B, V) fp32, suppressed ids at -inf. finished: (B,) bool. tokens: (B,) int64. out: (B, T) int64.
        pos: (1,) int64. x: (B, D) the next step's input. mask: (L,) additive self-attention mask (x's dtype).
        embed: (V, D), pos_embed: (P, D) in x's dtype.
    """
    token = logits.argmax(dim=-1).masked_fill_(finished, PAD_ID)
    out.index_copy_(1, pos, token[:, None])
    tokens.copy_(token)
    finished.logical_or_(token == EOS_ID)
    following = pos + 1
    x.copy_(embed.index_select(0, token) + pos_embed.index_select(0, following.clamp(max=pos_embed.shape[0] - 1)))
    mask.index_fill_(0, following.clamp(max=mask.shape[0] - 1), 0.0)
    pos.add_(1)


@triton_jit
def _greedy_step_kernel(
    Logits_ptr,
    Candidates_ptr,
    Finished_ptr,
    Tokens_ptr,
    Out_ptr,
    Pos_ptr,
    X_ptr,
    Mask_ptr,
    Embed_ptr,
    PosEmbed_ptr,
    B,
    V,
    D,
    T,
    P,
    L,
    PAD: tl.constexpr,
    EOS: tl.constexpr,
    ROUND_BF16: tl.constexpr,
    FROM_CANDIDATES: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """One program: every row's pick and next input, then the mask entry and the position."""
    pos = tl.load(Pos_ptr)
    following = pos + 1
    for r0 in range(0, B, BLOCK_B):
        rows = r0 + tl.arange(0, BLOCK_B)
        row_ok = rows < B
        best = tl.full((BLOCK_B,), float("-inf"), tl.float32)
        best_index = tl.zeros((BLOCK_B,), dtype=tl.int64)
        for v0 in range(0, V, BLOCK_V):  # running first maximum over vocabulary chunks
            cols = v0 + tl.arange(0, BLOCK_V)
            ok = row_ok[:, None] & (cols < V)[None, :]
            scores = tl.load(Logits_ptr + rows.to(tl.int64)[:, None] * V + cols[None, :], mask=ok, other=float("-inf"))
            chunk_best = tl.max(scores, axis=1)
            chunk_index = tl.argmax(scores, axis=1, tie_break_left=True).to(tl.int64) + v0
            better = chunk_best > best  # strictly: an equal value later keeps the earlier index, as torch.argmax
            best_index = tl.where(better, chunk_index, best_index)
            best = tl.where(better, chunk_best, best)
        if FROM_CANDIDATES:  # the scores were tile maxima (procap.kernels.logits_pick): the winner's own index
            best_index = tl.load(Candidates_ptr + rows.to(tl.int64) * V + best_index, mask=row_ok, other=0)
        done = tl.load(Finished_ptr + rows, mask=row_ok, other=0).to(tl.int1)
        token = tl.where(done, PAD, best_index)
        tl.store(Out_ptr + rows.to(tl.int64) * T + pos, token, mask=row_ok)
        tl.store(Tokens_ptr + rows, token, mask=row_ok)
        tl.store(Finished_ptr + rows, (done | (token == EOS)).to(Finished_ptr.dtype.element_ty), mask=row_ok)
        if following < P:
            for d0 in range(0, D, BLOCK_D):
                dims = d0 + tl.arange(0, BLOCK_D)
                ok = row_ok[:, None] & (dims < D)[None, :]
                e = tl.load(Embed_ptr + token[:, None] * D + dims[None, :], mask=ok, other=0.0).to(tl.float32)
                # The position row loaded as a (1, BLOCK_D) tile: loaded 1-D, its layout conversion to the tile's
                # made ptxas 12.8 (Triton 3.6) spill 4 bytes in fp16 / bf16 (docs/kernels.md, compile check).
                p = tl.load(PosEmbed_ptr + following * D + dims[None, :], mask=(dims < D)[None, :], other=0.0)
                value = as_stored(e + p.to(tl.float32), X_ptr, ROUND_BF16)
                tl.store(
                    X_ptr + rows.to(tl.int64)[:, None] * D + dims[None, :], value.to(X_ptr.dtype.element_ty), mask=ok
                )
    if following < L:
        tl.store(Mask_ptr + following, 0.0)
    tl.store(Pos_ptr, following)


def _check_buffers(
    logits: torch.Tensor, out: torch.Tensor, x: torch.Tensor, embed: torch.Tensor, others: tuple[torch.Tensor, ...]
) -> None:
    """Refuse buffers the kernel cannot write in place: shapes that do not fit, non-contiguous ones, CPU ones."""
    batch, dim = logits.shape[0], x.shape[1]
    if logits.dtype != torch.float32 or out.shape[0] != batch or x.shape[0] != batch or embed.shape[1] != dim:
        raise ValueError("greedy_step: logits (B, V) fp32, out (B, T), x (B, D) and embed (V, D) must fit together")
    if not all(t.is_contiguous() for t in (logits, out, x, embed, *others)):
        raise ValueError("greedy_step writes its buffers in place and needs them contiguous")
    require_triton_tensor(logits, "greedy step")


def greedy_step_triton(
    logits: torch.Tensor,
    finished: torch.Tensor,
    tokens: torch.Tensor,
    out: torch.Tensor,
    pos: torch.Tensor,
    x: torch.Tensor,
    mask: torch.Tensor,
    embed: torch.Tensor,
    pos_embed: torch.Tensor,
    candidates: torch.Tensor | None = None,
) -> None:
    """Triton version of :func:`greedy_step_ref` (same arguments, same in-place results, no host sync).

    ``candidates`` (B, C) int64: ``logits`` are then (B, C) maxima of vocabulary tiles in vocabulary order and
    ``candidates`` each tile's first index of its maximum (``procap.kernels.logits_pick``); the first maximum over the
    tiles picks that tile's index, the first index of the row's maximum.
    """
    _check_buffers(logits, out, x, embed, (finished, tokens, mask, pos_embed))
    if candidates is not None and (candidates.shape != logits.shape or candidates.dtype != torch.long):
        raise ValueError("greedy_step: candidates must be int64 of the logits' shape")
    batch, vocab = logits.shape
    dim = x.shape[1]
    _greedy_step_kernel[(1,)](
        logits,
        logits if candidates is None else candidates,  # not read without candidates
        finished,
        tokens,
        out,
        pos,
        x,
        mask,
        embed,
        pos_embed,
        batch,
        vocab,
        dim,
        out.shape[1],
        pos_embed.shape[0],
        mask.shape[0],
        PAD=PAD_ID,
        EOS=EOS_ID,
        ROUND_BF16=INTERPRETED and x.dtype == torch.bfloat16,
        FROM_CANDIDATES=candidates is not None,
        BLOCK_B=BLOCK_ROWS,
        BLOCK_V=min(triton.next_power_of_2(vocab), MAX_BLOCK),
        BLOCK_D=min(triton.next_power_of_2(dim), MAX_BLOCK),
        num_warps=4,
    )


# ----------------------------------------------------------------------------------------------- dispatch
GREEDY_STEP = register(
    FusedOp("greedy_step", greedy_step_ref, greedy_step_triton, dtypes=(torch.float32,), differentiable=False)
)


def greedy_step(
    logits: torch.Tensor,
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
    """The step's pick and bookkeeping (module docstring), in one launch on CUDA; the reference elsewhere."""
    args = (logits, finished, tokens, out, pos, x, mask, embed, pos_embed)
    run("greedy_step", impl, logits, False, *args)
