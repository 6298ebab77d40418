"""The cached greedy decoding step of ``procap.fast``: same math as ``ProCap.generate``, one token per call.

:class:`DecodeState` owns every buffer the step touches (token ids, the position as a device tensor, the
finished flags, the output tokens, the self-attention KV cache and the memory's cross-attention K/V), sized
for one batch bucket. :meth:`DecodeState.step` runs all decoder layers for one position, the tied output
projection, the greedy pick with the same suppressed ids as ``procap.model.decoder.greedy_decode`` and the EOS
bookkeeping, reading and writing only those buffers: nothing synchronises with the host, so it can be
captured once in a CUDA graph and replayed ``max_len - 1`` times.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from procap.attention import attention
from procap.fast.kv_cache import CrossKV, StaticKVCache
from procap.model.decoder import BOS_ID, EOS_ID, PAD_ID, SUPPRESSED_IDS, CaptionDecoder


def _split(x: torch.Tensor, heads: int) -> torch.Tensor:
    """(B, L, D) -> (B, H, L, Dh)."""
    b, n, d = x.shape
    return x.view(b, n, heads, d // heads).transpose(1, 2)


def _merge(x: torch.Tensor) -> torch.Tensor:
    """(B, H, L, Dh) -> (B, L, D)."""
    b, h, n, dh = x.shape
    return x.transpose(1, 2).reshape(b, n, h * dh)


class DecodeState:
    """Static decoding buffers for ``batch`` rows and captions of ``max_len`` tokens (BOS included).

    Args:
        decoder: the (eval-mode) caption decoder whose weights the step uses.
        batch: rows, the bucket size (real rows first, padding rows after).
        memory_tokens: N, the memory length ((k + 2) * n).
        max_len: caption length including BOS; ``max_len - 1`` steps are decoded.
        dtype, device: placement of the activations (the decoder's weights must match).
        backend: ``procap.attention`` backend of the step's attention calls.

    Attributes:
        tokens: (B,) the ids fed to the next step; ``pos``: (1,) its position.
        finished: (B,) rows that produced EOS; ``out``: (B, max_len - 1) produced tokens.
        logits: (B, V) fp32 logits of the last step after suppression (for agreement checks).
    """

    def __init__(
        self,
        decoder: CaptionDecoder,
        batch: int,
        memory_tokens: int,
        max_len: int,
        dtype: torch.dtype,
        device: torch.device,
        backend: str = "auto",
    ) -> None:
        first = decoder.layers[0].self_attn
        self.decoder, self.heads, self.backend = decoder, first.heads, backend
        self.batch, self.steps = batch, max_len - 1
        layers, dim = len(decoder.layers), decoder.embed.weight.shape[1]
        head_dim = dim // self.heads
        self.cache = StaticKVCache(layers, batch, self.heads, self.steps, head_dim, dtype, device)
        self.cross = CrossKV(layers, batch, self.heads, memory_tokens, head_dim, dtype, device)
        self.tokens = torch.full((batch,), BOS_ID, dtype=torch.long, device=device)
        self.pos = torch.zeros(1, dtype=torch.long, device=device)
        self.finished = torch.zeros(batch, dtype=torch.bool, device=device)
        self.out = torch.full((batch, self.steps), PAD_ID, dtype=torch.long, device=device)
        # Additive logit bias: -inf on suppressed ids, 0 elsewhere. Adding 0.0 is exact, so the argmax equals
        # greedy_decode's (which writes -inf into the same ids).
        vocab = decoder.embed.weight.shape[0]
        self.suppress = torch.zeros(vocab, dtype=torch.float32, device=device)
        self.suppress[list(SUPPRESSED_IDS)] = float("-inf")
        self.pad = torch.full((batch,), PAD_ID, dtype=torch.long, device=device)
        self.logits = torch.zeros(batch, vocab, dtype=torch.float32, device=device)  # last step's, for checks
        # Self-attention q/k/v packed into one (3D, D) projection per layer: one GEMM per step instead of three.
        self.qkv = [
            (
                torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]).detach(),
                torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias]).detach(),
            )
            for a in (layer.self_attn for layer in decoder.layers)
        ]

    @torch.no_grad()
    def prefill(self, memory: torch.Tensor) -> None:
        """Project the memory (b, N, D), b <= batch, into every layer's cross K/V and reset the decoding state.

        Rows b..batch-1 keep whatever K/V they held (finite values): their tokens are computed and discarded.
        """
        for i, layer in enumerate(self.decoder.layers):
            ca = layer.cross_attn
            self.cross.fill(i, _split(ca.k_proj(memory), self.heads), _split(ca.v_proj(memory), self.heads))
        self.reset()

    def reset(self) -> None:
        """Back to "BOS at position 0, nothing finished" (in place: graphs keep pointing at these buffers)."""
        self.tokens.fill_(BOS_ID)
        self.pos.zero_()
        self.finished.zero_()
        self.out.fill_(PAD_ID)

    def _layer(self, i: int, layer: nn.Module, x: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
        """One pre-LN decoder block for a single position: (B, 1, D) -> (B, 1, D)."""
        sa, ca, h = layer.self_attn, layer.cross_attn, self.heads
        q, k, v = F.linear(layer.norm1(x), *self.qkv[i]).chunk(3, dim=-1)  # (B, 1, D) each
        k, v = self.cache.update(i, self.pos, _split(k, h), _split(v, h))
        a = attention(_split(q, h), k, v, attn_mask=visible, backend=self.backend)
        x = x + sa.out_proj(_merge(a))
        y = layer.norm2(x)
        a = attention(_split(ca.q_proj(y), h), self.cross.k[i], self.cross.v[i], backend=self.backend)
        x = x + ca.out_proj(_merge(a))
        return x + layer.ffn(layer.norm3(x))

    @torch.no_grad()
    def step(self) -> None:
        """Decode position ``pos``: all layers, logits, greedy pick, EOS bookkeeping; advances ``pos``."""
        dec = self.decoder
        x = (dec.embed(self.tokens) + dec.pos_embed.index_select(0, self.pos))[:, None]  # (B, 1, D)
        visible = self.cache.visible(self.pos)  # keys 0..pos
        for i, layer in enumerate(dec.layers):
            x = self._layer(i, layer, x, visible)
        logits = (dec.norm(x[:, 0]) @ dec.embed.weight.t()).float() + self.suppress  # (B, V), fp32 like generate
        self.logits.copy_(logits)
        nxt = torch.where(self.finished, self.pad, logits.argmax(dim=-1))
        self.finished |= nxt == EOS_ID
        self.out.index_copy_(1, self.pos, nxt[:, None])
        self.tokens.copy_(nxt)
        self.pos += 1
