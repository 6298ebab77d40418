"""A lean cached decoding step for ``procap.fast``: the model decoder's step in 13 ops per layer plus 3.

:meth:`procap.model.decoder.CaptionDecoder.decode_step` is the readable cached step (about 60 kernel-launching ATen
ops for the two-layer ``clevr`` decoder: the embedding and the position broadcast add, separate q/k/v projections,
transposed cache writes, a bool mask turned into an additive one per layer, residual adds and LayerNorms apart, the
pick as ten tiny ops). At decoding batch sizes every op is a few microseconds of launch latency, so the count is the
cost. :class:`LeanDecoder` runs the same computation on the same weights with

- q, k and v of the self-attention in one GEMM (weights concatenated once), the new keys/values written into a
  (B, T, 2D) cache with one ``index_copy_``, read by attention as strided (B, H, T, Dh) views;
- an additive self-attention mask of the decoded positions kept in a buffer (one entry opened per step by the
  pick) instead of comparing positions in every layer;
- the cross-attention keys/values of the memory written by one GEMM per layer straight into a (B, N, 2D) cache
  (``addmm(out=...)``), no transposed copy;
- each residual add fused with the LayerNorm that follows it (``procap.kernels.add_layer_norm``), the last one
  with the final norm, writing the fp32 hidden state the logits read;
- the logits as one fp32 GEMM whose bias is 0 or -inf (the suppressed ids), written into the state;
- the pick, the EOS bookkeeping, the next token's embedding + position and the mask entry in one launch
  (``procap.kernels.greedy_step``).

Every buffer and view is made once per bucket (:class:`LeanDecodingState`), so the step dispatches no view op
either. Attention uses ``torch.nn.functional.scaled_dot_product_attention`` (PyTorch's kernel choice, or the one an
``sdpa_*`` backend pins). The model's ``decode_step`` stays the reference: the tests compare logits and tokens.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from procap import kernels
from procap.model.decoder import BOS_ID, PAD_ID, SUPPRESSED_IDS, CaptionDecoder
from procap.validate import same_device

KEY_ALIGNMENT = 16  # self-attention keys allocated in multiples of this (aligned mask rows for fused kernels)
SDPA_BACKENDS = ("sdpa", "sdpa_efficient", "sdpa_math")  # the attention backends the lean step can honour


def lean_decoding_supported(decoder: torch.nn.Module, backend: str) -> bool:
    """Whether :class:`LeanDecoder` can stand in for ``decoder.decode_step`` with attention ``backend`` (resolved)."""
    return type(decoder) is CaptionDecoder and backend in SDPA_BACKENDS


class _LayerWeights:
    """One decoder layer's weights as the lean step reads them: transposed views and the merged projections."""

    def __init__(self, layer: torch.nn.Module) -> None:
        sa, ca = layer.self_attn, layer.cross_attn
        self.qkv_weight_t = torch.cat([sa.q_proj.weight, sa.k_proj.weight, sa.v_proj.weight]).t()
        self.qkv_bias = torch.cat([sa.q_proj.bias, sa.k_proj.bias, sa.v_proj.bias])
        self.out_weight_t, self.out_bias = sa.out_proj.weight.t(), sa.out_proj.bias
        self.cross_q_weight_t, self.cross_q_bias = ca.q_proj.weight.t(), ca.q_proj.bias
        self.cross_kv_weight_t = torch.cat([ca.k_proj.weight, ca.v_proj.weight]).t()
        self.cross_kv_bias = torch.cat([ca.k_proj.bias, ca.v_proj.bias])
        self.cross_out_weight_t, self.cross_out_bias = ca.out_proj.weight.t(), ca.out_proj.bias
        self.fc1_weight_t, self.fc1_bias = layer.ffn.fc1.weight.t(), layer.ffn.fc1.bias
        self.fc2_weight_t, self.fc2_bias = layer.ffn.fc2.weight.t(), layer.ffn.fc2.bias
        self.activation = layer.ffn.activation
        self.norms = (layer.norm1, layer.norm2, layer.norm3)


class LeanDecodingState:
    """Every buffer (and view) of a lean greedy decode for ``batch`` rows; the attributes of a ``DecodingState``.

    Attributes:
        tokens, pos, finished, out, logits, steps: as :class:`procap.model.decoder.DecodingState`.
        x: (B, D) the next step's input (``embed[token] + pos_embed[pos]``), then its residual stream.
        mask: (K,) additive self-attention mask over K >= steps + 1 cached positions (0 visible, -inf not yet).
    """

    def __init__(self, decoder: LeanDecoder, batch: int, max_len: int, memory_len: int) -> None:
        weight = decoder.embed_weight
        dtype, device = weight.dtype, weight.device
        dim, heads = decoder.dim, decoder.heads
        head_dim = dim // heads
        self.decoder, self.batch, self.steps = decoder, batch, max_len - 1
        keys = -(-(self.steps + 1) // KEY_ALIGNMENT) * KEY_ALIGNMENT
        self.tokens = torch.full((batch,), BOS_ID, dtype=torch.long, device=device)
        self.pos = torch.zeros(1, dtype=torch.long, device=device)
        self.finished = torch.zeros(batch, dtype=torch.bool, device=device)
        self.out = torch.full((batch, self.steps), PAD_ID, dtype=torch.long, device=device)
        self.logits = torch.zeros(batch, weight.shape[0], dtype=torch.float32, device=device)
        self.x = torch.zeros(batch, dim, dtype=dtype, device=device)
        self.mask = torch.zeros(keys, dtype=dtype, device=device)
        self.mask_view = self.mask.view(1, 1, 1, keys)
        self.qkv = torch.zeros(batch, 3 * dim, dtype=dtype, device=device)  # shared by the layers, used in turn
        self.q_self = self.qkv[:, :dim].view(batch, heads, 1, head_dim)
        self.kv_new = self.qkv[:, None, dim:]
        self.q_cross_rows = torch.zeros(batch, dim, dtype=dtype, device=device)
        self.q_cross = self.q_cross_rows.view(batch, heads, 1, head_dim)
        self.self_kv, self.cross_kv, self.self_kv_heads, self.cross_kv_heads = [], [], [], []
        for _ in range(decoder.num_layers):
            for length, flat, split in (
                (keys, self.self_kv, self.self_kv_heads),
                (memory_len, self.cross_kv, self.cross_kv_heads),
            ):
                buffer = torch.zeros(batch, length, 2 * dim, dtype=dtype, device=device)
                flat.append(buffer)
                split.append(
                    tuple(
                        buffer[..., i * dim : (i + 1) * dim].view(batch, length, heads, head_dim).transpose(1, 2)
                        for i in range(2)
                    )
                )
        self.reset()

    def reset(self) -> None:
        """Back to "BOS at position 0, nothing finished", in place (captured graphs keep these buffers)."""
        self.tokens.fill_(BOS_ID)
        self.pos.zero_()
        self.finished.zero_()
        self.out.fill_(PAD_ID)
        self.mask.fill_(float("-inf"))
        self.mask[:1].zero_()
        self.x.copy_(self.decoder.first_input.expand_as(self.x))


class LeanDecoder:
    """The cached greedy step of a :class:`CaptionDecoder` with fewer, fused ops (module docstring).

    Built once from a decoder already on its device and dtype (the weights are read, concatenated copies of the
    q/k/v projections and an fp32 copy of the tied output projection are made); rebuild it after moving the model.

    Args:
        decoder: the model's caption decoder (eval mode).
        backend: the resolved attention backend, one of :data:`SDPA_BACKENDS`.
    """

    def __init__(self, decoder: CaptionDecoder, backend: str = "sdpa") -> None:
        if not lean_decoding_supported(decoder, backend):
            raise ValueError(
                f"the lean step runs a CaptionDecoder with an SDPA backend, got {type(decoder).__name__}, {backend!r}"
            )
        self.backend = backend
        self.embed_weight, self.pos_embed = decoder.embed.weight, decoder.pos_embed
        self.dim, self.heads = decoder.embed.weight.shape[1], decoder.layers[0].self_attn.heads
        self.memory_len, self.num_layers = decoder.memory_len, len(decoder.layers)
        with torch.no_grad():
            self.layers = [_LayerWeights(layer) for layer in decoder.layers]
            self.final_norm = decoder.norm
            self.logits_weight_t = decoder.embed.weight.float().t()  # the fp32 tied projection, converted once
            suppress = torch.zeros(self.embed_weight.shape[0], dtype=torch.float32, device=self.embed_weight.device)
            suppress[list(SUPPRESSED_IDS)] = float("-inf")
            self.suppress_bias = suppress
            self.first_input = decoder.embed.weight[BOS_ID] + decoder.pos_embed[0]  # rounded like the eager add

    def setup_caches(
        self, batch: int, max_len: int, dtype: torch.dtype, device: torch.device | str
    ) -> LeanDecodingState:
        """Buffers for ``batch`` rows and captions of ``max_len`` tokens (dtype and device: the weights')."""
        if not 2 <= max_len <= self.pos_embed.shape[0]:
            raise ValueError(f"max_len must be in [2, {self.pos_embed.shape[0]}], got {max_len}")
        if dtype != self.embed_weight.dtype or not same_device(device, self.embed_weight.device):
            raise ValueError("the lean decoder's buffers live with its weights: build it after moving the model")
        return LeanDecodingState(self, batch, max_len, self.memory_len)

    @torch.no_grad()
    def prefill(self, memory: torch.Tensor, state: LeanDecodingState) -> None:
        """Cross-attention keys/values of a memory (b, N, D), b <= state.batch, one GEMM per layer; reset ``state``."""
        b, n, d = memory.shape
        rows = memory.reshape(b * n, d)
        for weights, cache in zip(self.layers, state.cross_kv):
            torch.addmm(weights.cross_kv_bias, rows, weights.cross_kv_weight_t, out=cache[:b].view(b * n, 2 * d))
        state.reset()

    def _attend(
        self, q: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor], mask: torch.Tensor | None
    ) -> torch.Tensor:
        pin = contextlib.nullcontext()
        if self.backend != "sdpa":
            from torch.nn.attention import SDPBackend, sdpa_kernel

            pin = sdpa_kernel(
                [{"sdpa_efficient": SDPBackend.EFFICIENT_ATTENTION, "sdpa_math": SDPBackend.MATH}[self.backend]]
            )
        with pin:
            return F.scaled_dot_product_attention(q, kv[0], kv[1], attn_mask=mask)

    @torch.no_grad()
    def decode_step(self, state: LeanDecodingState) -> None:
        """Decode position ``state.pos``: logits, greedy pick, EOS bookkeeping, next input; advances ``state.pos``."""
        x, rows = state.x, state.batch
        norm = self.layers[0].norms[0]
        h = F.layer_norm(x, norm.normalized_shape, norm.weight, norm.bias, norm.eps)
        for index, w in enumerate(self.layers):
            torch.addmm(w.qkv_bias, h, w.qkv_weight_t, out=state.qkv)
            state.self_kv[index].index_copy_(1, state.pos, state.kv_new)
            attended = self._attend(state.q_self, state.self_kv_heads[index], state.mask_view)
            h = self._add_norm(x, torch.addmm(w.out_bias, attended.view(rows, self.dim), w.out_weight_t), w.norms[1])
            torch.addmm(w.cross_q_bias, h, w.cross_q_weight_t, out=state.q_cross_rows)
            attended = self._attend(state.q_cross, state.cross_kv_heads[index], None)
            out = torch.addmm(w.cross_out_bias, attended.view(rows, self.dim), w.cross_out_weight_t)
            h = self._add_norm(x, out, w.norms[2])
            hidden = w.activation(torch.addmm(w.fc1_bias, h, w.fc1_weight_t))
            last = index + 1 == self.num_layers
            following = self.final_norm if last else self.layers[index + 1].norms[0]
            h = self._add_norm(x, torch.addmm(w.fc2_bias, hidden, w.fc2_weight_t), following, last)
        torch.addmm(self.suppress_bias, h, self.logits_weight_t, out=state.logits)
        kernels.greedy_step(
            state.logits,
            state.finished,
            state.tokens,
            state.out,
            state.pos,
            x,
            state.mask,
            self.embed_weight,
            self.pos_embed,
        )

    @staticmethod
    def _add_norm(x: torch.Tensor, h: torch.Tensor, norm: torch.nn.LayerNorm, fp32: bool = False) -> torch.Tensor:
        return kernels.add_layer_norm(x, h, norm.weight, norm.bias, norm.eps, torch.float32 if fp32 else None)
