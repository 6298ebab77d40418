"""The caption decoder's cached decoding step in fused form: what :class:`~procap.model.decoder.CaptionDecoder` runs
unless ``use_fused(False)`` chose its readable form (:mod:`procap.model.fused_form`).

:meth:`CaptionDecoder.forward` and :func:`~procap.model.decoder.greedy_decode` are the readable oracle (the whole
prefix through the :class:`~procap.model.decoder.DecoderLayer` s every step). Decoding with caches runs the same
computation on the same weights with fewer launches, because at decoding batch sizes each op is a few microseconds
of launch latency and the count is the cost (the two-layer ``clevr`` decoder: 29 kernel-launching ops a step, where
the layers written out op by op take about 60):

- q, k and v of the self-attention in one GEMM (weights concatenated at set-up), the new keys/values written into a
  (B, T, 2D) cache with one ``index_copy_``, read by attention as strided (B, H, T, Dh) views;
- an additive self-attention mask of the decoded positions kept in a buffer (one entry opened per step by the
  pick) instead of comparing positions in every layer;
- the cross-attention keys/values of the memory written by one GEMM per layer straight into a (B, N, 2D) cache
  (``addmm(out=...)``), no transposed copy;
- each residual add fused with the LayerNorm that follows it (``procap.kernels.add_layer_norm``), the last one
  with the final norm, writing the fp32 hidden state the logits read;
- the logits as one fp32 GEMM whose bias is 0 or -inf (the suppressed ids), written into the state;
- the pick, the EOS bookkeeping, the next token's embedding + position and the mask entry in one launch
  (``procap.kernels.greedy_step``); with the decoder's ``logits_pick`` option the logits GEMV and the pick of each
  vocabulary tile in one Triton kernel instead of the GEMM, the greedy step reducing the tiles
  (``procap.kernels.greedy_logits_step``; opt-in until a GPU has timed it);
- with the decoder's ``split_k_attention`` option the cross attention (one query per head over the memory's cached
  keys) through the split-K kernels of ``procap.kernels.decode_attention`` instead of the attention backend
  (opt-in until a GPU has timed it);
- with the decoder's ``mlp`` option each layer's fc1 + erf GELU + fc2 in one Triton kernel, the hidden activation
  kept on chip (``procap.kernels.decode_mlp``; opt-in until a GPU has timed it).

Every buffer and view is made once per :class:`FusedDecodingState`, so the step dispatches no view op either.
Attention goes through :func:`procap.kernels.attention.attention`, like every other layer's, with the backend
resolved once when the state is set up (``auto`` is not looked up again in a step a graph replays) and the additive
mask as it is: SDPA takes it directly, so no step builds a bool mask.

This module reads the decoder it is given and imports nothing of :mod:`procap.model.decoder`, which chooses it
(:meth:`~procap.model.decoder.CaptionDecoder.use_fused`), but its class names for the type checker.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from procap import kernels
from procap.core.errors import ProCapError
from procap.kernels import fp8
from procap.kernels.attention import attention, backend_for_mask
from procap.kernels.logits_pick import logits_tiles

if TYPE_CHECKING:  # the decoder imports this module to run it
    from procap.model.decoder import CaptionDecoder, DecoderLayer

KEY_ALIGNMENT = 16  # self-attention keys allocated in multiples of this (aligned mask rows for fused kernels)


class _LayerWeights:
    """One decoder layer's weights as the fused step reads them: transposed views and the merged projections."""

    def __init__(self, layer: DecoderLayer) -> None:
        sa, ca = layer.self_attn, layer.cross_attn
        self.qkv_weight_t = torch.cat([sa.q_proj.weight, sa.k_proj.weight, sa.v_proj.weight]).t()
        self.qkv_bias = torch.cat([sa.q_proj.bias, sa.k_proj.bias, sa.v_proj.bias])
        self.out_weight_t, self.out_bias = sa.out_proj.weight.t(), sa.out_proj.bias
        self.cross_q_weight_t, self.cross_q_bias = ca.q_proj.weight.t(), ca.q_proj.bias
        self.cross_kv_weight_t = torch.cat([ca.k_proj.weight, ca.v_proj.weight]).t()
        self.cross_kv_bias = torch.cat([ca.k_proj.bias, ca.v_proj.bias])
        self.cross_out_weight_t, self.cross_out_bias = ca.out_proj.weight.t(), ca.out_proj.bias
        self.fc1_weight, self.fc1_bias = layer.ffn.fc1.weight, layer.ffn.fc1.bias
        self.fc2_weight, self.fc2_bias = layer.ffn.fc2.weight, layer.ffn.fc2.bias
        self.fc1_weight_t, self.fc2_weight_t = self.fc1_weight.t(), self.fc2_weight.t()
        self.activation = layer.ffn.activation
        self.norms = (layer.norm1, layer.norm2, layer.norm3)


class FusedWeights:
    """The decoder's weights in the fused step's layout, made once per decoding state from the weights of that moment
    (merged q/k/v and k/v copies, an fp32 copy of the tied output projection): set up again after the weights change.
    """

    @torch.no_grad()
    def __init__(
        self,
        decoder: CaptionDecoder,
        backend: str,
        bos_id: int,
        pad_id: int,
        logits_pick: bool = False,
        split_k_attention: bool = False,
        mlp: bool = False,
    ) -> None:
        """``backend``: a resolved attention backend (not ``auto``); ``logits_pick``: the greedy step's logits and
        pick through :func:`procap.kernels.greedy_logits_step`; ``split_k_attention``: the cross attention through
        :func:`procap.kernels.decode_attention`; ``mlp``: each layer's fc1 + GELU + fc2 through
        :func:`procap.kernels.decode_mlp` (whose GELU is the erf one the decoder's layers use)."""
        self.backend, self.bos_id, self.pad_id, self.logits_pick = backend, bos_id, pad_id, logits_pick
        self.split_k_attention, self.mlp = split_k_attention, mlp
        self.embed_weight, self.pos_embed = decoder.embed.weight, decoder.pos_embed
        self.dim, self.heads = decoder.embed.weight.shape[1], decoder.layers[0].self_attn.heads
        self.layers = [_LayerWeights(layer) for layer in decoder.layers]
        if mlp and any(layer.activation is not F.gelu for layer in self.layers):
            raise ProCapError(
                "fused_decoder option mlp computes the erf GELU, but this decoder's layers use another activation."
            )
        self.final_norm = decoder.norm
        self.logits_weight = decoder.embed.weight.float()  # (V, D): the fused pick reads rows
        self.logits_weight_t = self.logits_weight.t()
        suppress = torch.zeros(self.embed_weight.shape[0], dtype=torch.float32, device=self.embed_weight.device)
        self.suppress_bias = suppress.masked_fill(decoder.suppressed, float("-inf"))
        self.first_input = decoder.embed.weight[bos_id] + decoder.pos_embed[0]  # rounded like the eager add


class FusedDecodingState:
    """Every buffer (and view) of a fused cached decode for ``batch`` rows; the attributes of a ``DecodingState``.

    Attributes:
        weights: the :class:`FusedWeights` the step reads.
        tokens, pos, finished, out, logits, steps: as :class:`procap.model.decoder.DecodingState`.
        x: (B, D) the next step's input (``embed[token] + pos_embed[pos]``), then its residual stream.
        mask: (K,) additive self-attention mask over K >= steps + 1 cached positions (0 visible, -inf not yet).
    """

    def __init__(
        self,
        weights: FusedWeights,
        num_layers: int,
        batch: int,
        max_len: int,
        memory_len: int,
        cross_kv_dtype: torch.dtype | None = None,
    ) -> None:
        weight = weights.embed_weight
        dtype, device = weight.dtype, weight.device
        dim, heads = weights.dim, weights.heads
        head_dim = dim // heads
        self.weights, self.batch, self.steps = weights, batch, max_len - 1
        keys = -(-(self.steps + 1) // KEY_ALIGNMENT) * KEY_ALIGNMENT
        self.tokens = torch.full((batch,), 0, dtype=torch.long, device=device)
        self.pos = torch.zeros(1, dtype=torch.long, device=device)
        self.finished = torch.zeros(batch, dtype=torch.bool, device=device)
        self.out = torch.zeros(batch, self.steps, dtype=torch.long, device=device)
        self.logits = torch.zeros(batch, weight.shape[0], dtype=torch.float32, device=device)
        tiles = logits_tiles(weight.shape[0])  # the fused pick's per-tile maxima and indices
        self.tile_max = torch.zeros(batch, tiles, dtype=torch.float32, device=device)
        self.tile_index = torch.zeros(batch, tiles, dtype=torch.long, device=device)
        self.x = torch.zeros(batch, dim, dtype=dtype, device=device)
        self.mask = torch.zeros(keys, dtype=dtype, device=device)
        self.mask_view = self.mask.view(1, 1, 1, keys)
        self.qkv = torch.zeros(batch, 3 * dim, dtype=dtype, device=device)  # shared by the layers, used in turn
        self.q_self = self.qkv[:, :dim].view(batch, heads, 1, head_dim)
        self.kv_new = self.qkv[:, None, dim:]
        self.q_cross_rows = torch.zeros(batch, dim, dtype=dtype, device=device)
        self.q_cross = self.q_cross_rows.view(batch, heads, 1, head_dim)
        hidden = weights.layers[0].fc1_weight.shape[0]  # the fused MLP's partial products and counters, if chosen
        self.mlp_workspace = kernels.decode_mlp_workspace(batch, dim, hidden, device) if weights.mlp else None
        self.self_kv: list[torch.Tensor] = []
        self.cross_kv: list[torch.Tensor] = []
        self.self_kv_heads: list[tuple[torch.Tensor, torch.Tensor]] = []  # (keys, values) views of each buffer
        self.cross_kv_heads: list[tuple[torch.Tensor, torch.Tensor]] = []
        e4m3 = cross_kv_dtype == fp8.E4M3  # FP8 cross keys/values: every layer attends from one working buffer
        for index in range(num_layers):
            for length, flat, split in (
                (keys, self.self_kv, self.self_kv_heads),
                (memory_len, self.cross_kv, self.cross_kv_heads),
            ):
                shared = e4m3 and flat is self.cross_kv and index > 0
                buffer = flat[0] if shared else torch.zeros(batch, length, 2 * dim, dtype=dtype, device=device)
                flat.append(buffer)
                key_heads, value_heads = (
                    buffer[..., i * dim : (i + 1) * dim].view(batch, length, heads, head_dim).transpose(1, 2)
                    for i in range(2)
                )
                split.append((key_heads, value_heads))
        self.cross_kv_e4m3 = Fp8CrossCache(self.cross_kv[0], num_layers, heads) if e4m3 else None

    def reset(self) -> None:
        """Back to "BOS at position 0, nothing finished", in place (captured graphs keep these buffers)."""
        self.tokens.fill_(self.weights.bos_id)
        self.pos.zero_()
        self.finished.zero_()
        self.out.fill_(self.weights.pad_id)
        self.mask.fill_(float("-inf"))
        self.mask[:1].zero_()
        self.x.copy_(self.weights.first_input.expand_as(self.x))

    def reorder_rows(self, rows: torch.Tensor) -> None:
        """Row i of every self-attention cache becomes row ``rows[i]`` (beam search follows its hypotheses)."""
        for buffer in self.self_kv:
            buffer.copy_(buffer.index_select(0, rows))


class Fp8CrossCache:
    """The cross-attention keys/values kept as e4m3 codes with one scale per token and head (``kv_cache_dtype``).

    The reference path: every layer's cache is one bf16 working buffer (the state's ``cross_kv``, all layers sharing
    it), which prefill writes and :meth:`store` quantises into that layer's codes, and which :meth:`load`
    dequantises again before the layer attends. So the values attended are the FP8 ones on every device; the bytes
    a step reads halve only once an attention kernel reads the codes itself (docs/gpu.md, issue 52).
    """

    def __init__(self, working: torch.Tensor, num_layers: int, heads: int) -> None:
        batch, length, width = working.shape
        self.working = working.view(batch, length, 2 * heads, width // (2 * heads))  # (B, N, K and V heads, Dh)
        self.codes = [torch.zeros(self.working.shape, dtype=fp8.E4M3, device=working.device) for _ in range(num_layers)]
        self.scales = [torch.ones(batch, length, 2 * heads, 1, device=working.device) for _ in range(num_layers)]

    def store(self, index: int, rows: int) -> None:
        """Quantise the first ``rows`` rows of the working buffer into layer ``index``'s codes and scales."""
        fp8.quantize_rows_into(self.working[:rows], self.codes[index][:rows], self.scales[index][:rows])

    def load(self, index: int) -> None:
        """Dequantise layer ``index``'s codes into the working buffer, which the layer's attention reads."""
        fp8.dequantize_into(self.codes[index], self.scales[index], self.working)


def prefill(state: FusedDecodingState, memory: torch.Tensor) -> None:
    """Cross-attention keys/values of a memory (b, N, D), b <= state.batch, one GEMM per layer."""
    b, n, d = memory.shape
    rows = memory.reshape(b * n, d)
    for index, (weights, cache) in enumerate(zip(state.weights.layers, state.cross_kv)):
        torch.addmm(weights.cross_kv_bias, rows, weights.cross_kv_weight_t, out=cache[:b].view(b * n, 2 * d))
        if state.cross_kv_e4m3 is not None:
            state.cross_kv_e4m3.store(index, b)


def _attend(
    backend: str, q: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor], mask: torch.Tensor | None
) -> torch.Tensor:
    """One query position over cached keys/values (B, H, T, Dh), ``mask`` additive (self-attention) or None."""
    return attention(q, kv[0], kv[1], attn_mask=mask, backend=backend_for_mask(backend, mask))


def _attend_memory(weights: FusedWeights, q: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """The cross attention's query over the memory's cached keys/values: the split-K kernels with
    ``split_k_attention``, else the attention backend."""
    if weights.split_k_attention:
        return kernels.decode_attention(q, kv[0], kv[1])
    return _attend(weights.backend, q, kv, None)


def _add_norm(x: torch.Tensor, h: torch.Tensor, norm: torch.nn.LayerNorm, fp32: bool = False) -> torch.Tensor:
    return kernels.add_layer_norm(x, h, norm.weight, norm.bias, norm.eps, torch.float32 if fp32 else None)


def hidden_step(state: FusedDecodingState) -> torch.Tensor:
    """The layers over the input ``state.x`` at position ``state.pos``: the final norm's fp32 output (B, D), the
    position's keys/values into the self-attention caches."""
    w_all, x, rows = state.weights, state.x, state.batch
    norm = w_all.layers[0].norms[0]
    h = F.layer_norm(x, norm.normalized_shape, norm.weight, norm.bias, norm.eps)
    for index, w in enumerate(w_all.layers):
        torch.addmm(w.qkv_bias, h, w.qkv_weight_t, out=state.qkv)
        state.self_kv[index].index_copy_(1, state.pos, state.kv_new)
        attended = _attend(w_all.backend, state.q_self, state.self_kv_heads[index], state.mask_view)
        h = _add_norm(x, torch.addmm(w.out_bias, attended.view(rows, w_all.dim), w.out_weight_t), w.norms[1])
        torch.addmm(w.cross_q_bias, h, w.cross_q_weight_t, out=state.q_cross_rows)
        if state.cross_kv_e4m3 is not None:
            state.cross_kv_e4m3.load(index)
        attended = _attend_memory(w_all, state.q_cross, state.cross_kv_heads[index])
        out = torch.addmm(w.cross_out_bias, attended.view(rows, w_all.dim), w.cross_out_weight_t)
        h = _add_norm(x, out, w.norms[2])
        last = index + 1 == len(w_all.layers)
        following = w_all.final_norm if last else w_all.layers[index + 1].norms[0]
        h = _add_norm(x, _mlp(state, w, h), following, last)
    return h


def _mlp(state: FusedDecodingState, w: _LayerWeights, h: torch.Tensor) -> torch.Tensor:
    """A layer's ``fc2(activation(fc1(h)))``: one kernel with the ``mlp`` option, else two GEMMs and the GELU."""
    if state.mlp_workspace is not None:
        return kernels.decode_mlp(h, w.fc1_weight, w.fc1_bias, w.fc2_weight, w.fc2_bias, *state.mlp_workspace)
    hidden = w.activation(torch.addmm(w.fc1_bias, h, w.fc1_weight_t))
    return torch.addmm(w.fc2_bias, hidden, w.fc2_weight_t)


def logits_step(state: FusedDecodingState) -> None:
    """:func:`hidden_step`, then its fp32 logits (suppressed ids at -inf) into ``state.logits``."""
    w = state.weights
    torch.addmm(w.suppress_bias, hidden_step(state), w.logits_weight_t, out=state.logits)


def greedy_step(state: FusedDecodingState) -> None:
    """One greedy step: :func:`logits_step`, then the pick, the EOS bookkeeping, the next input and mask entry
    (with ``logits_pick``: the logits and the pick of each vocabulary tile in one kernel, then the rest)."""
    w = state.weights
    if w.logits_pick:
        kernels.greedy_logits_step(
            hidden_step(state),
            w.logits_weight,
            w.suppress_bias,
            state.logits,
            state.tile_max,
            state.tile_index,
            state.finished,
            state.tokens,
            state.out,
            state.pos,
            state.x,
            state.mask,
            w.embed_weight,
            w.pos_embed,
        )
        return
    logits_step(state)
    kernels.greedy_step(
        state.logits,
        state.finished,
        state.tokens,
        state.out,
        state.pos,
        state.x,
        state.mask,
        w.embed_weight,
        w.pos_embed,
    )


def step_logits(state: FusedDecodingState, tokens: torch.Tensor) -> torch.Tensor:
    """fp32 logits (B, V) of ``tokens`` (B,) at ``state.pos`` (beam search, which picks and advances itself)."""
    w = state.weights
    state.x.copy_(w.embed_weight.index_select(0, tokens) + w.pos_embed.index_select(0, state.pos))
    state.mask.index_fill_(0, state.pos, 0.0)
    logits_step(state)
    return state.logits
