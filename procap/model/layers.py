"""Transformer pieces shared by the procedure encoder and the caption decoder.

Attention weights are separate ``q_proj`` / ``k_proj`` / ``v_proj`` / ``out_proj`` Linear layers (no fused QKV)
so that ``procap.fast`` can pack them however its kernels like without re-deriving a split. Every attention call
goes through :func:`procap.attention.attention`, the single place that picks a backend.
"""

from __future__ import annotations

import torch
from torch import nn

from procap.attention import attention


class MultiHeadAttention(nn.Module):
    """Multi-head (self- or cross-) attention.

    Args:
        dim: model width D.
        heads: number of heads; D must be divisible by it.
        dropout: dropout on the output projection.
    """

    def __init__(self, dim: int, heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim {dim} is not divisible by heads {heads}")
        self.heads = heads
        self.q_proj = nn.Linear(dim, dim)
        self.k_proj = nn.Linear(dim, dim)
        self.v_proj = nn.Linear(dim, dim)
        self.out_proj = nn.Linear(dim, dim)
        self.dropout = nn.Dropout(dropout)
        self.backend = "auto"  # procap.attention backend; tests set "math" to compare against the reference

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        return x.view(b, n, self.heads, d // self.heads).transpose(1, 2)  # (B, H, N, Dh)

    def forward(
        self,
        x: torch.Tensor,
        context: torch.Tensor | None = None,
        causal: bool = False,
        attn_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Attend from ``x`` to ``context`` (``x`` itself when None).

        Args:
            x: (B, Lq, D) queries.
            context: (B, Lk, D) keys/values source, or None for self-attention.
            causal: query i only sees keys <= i (self-attention over a prefix).
            attn_mask: optional bool (B, 1, Lq, Lk) mask, True = may attend.

        Returns:
            (B, Lq, D).
        """
        context = x if context is None else context
        q, k, v = self._split(self.q_proj(x)), self._split(self.k_proj(context)), self._split(self.v_proj(context))
        out = attention(q, k, v, causal=causal, attn_mask=attn_mask, backend=self.backend)  # (B, H, Lq, Dh)
        out = out.transpose(1, 2).reshape(x.shape[0], x.shape[1], -1)
        return self.dropout(self.out_proj(out))


class FeedForward(nn.Module):
    """``fc1`` -> GELU -> dropout -> ``fc2`` -> dropout."""

    def __init__(self, dim: int, hidden: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.fc2(self.dropout(torch.nn.functional.gelu(self.fc1(x)))))


def init_transformer_weights(module: nn.Module, std: float = 0.02) -> None:
    """BERT-style init: N(0, std) for Linear/Embedding weights, zero biases, LayerNorm (1, 0)."""
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=std)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
