"""Scaled dot-product attention behind one function, used by the encoder and the decoder.

Backends: ``math`` (the reference) and ``sdpa`` (PyTorch's fused kernels). ``auto`` picks the fastest
available for the device and dtype.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

BACKENDS = ("auto", "math", "sdpa")


def attention_math(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                   attn_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Reference attention, softmax in fp32.

    Args:
        q: (B, H, Lq, Dh); k, v: (B, H, Lk, Dh).
        causal: mask keys after the query position (query i sees keys <= i + Lk - Lq).
        attn_mask: optional bool mask broadcastable to (B, H, Lq, Lk), True = may attend.
    """
    scores = (q.float() @ k.float().transpose(-2, -1)) / math.sqrt(q.shape[-1])
    if causal:
        lq, lk = q.shape[-2], k.shape[-2]
        keep = torch.ones(lq, lk, dtype=torch.bool, device=q.device).tril(lk - lq)
        scores = scores.masked_fill(~keep, float("-inf"))
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf"))
    return (scores.softmax(-1) @ v.float()).to(q.dtype)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
              attn_mask: torch.Tensor | None = None, backend: str = "auto") -> torch.Tensor:
    """Attention over (B, H, L, Dh) tensors with the chosen backend; see :func:`attention_math`."""
    if backend == "math":
        return attention_math(q, k, v, causal, attn_mask)
    if backend not in BACKENDS:
        raise ValueError(f"unknown attention backend {backend!r}; choose one of {BACKENDS}")
    if causal and attn_mask is not None:
        lq, lk = q.shape[-2], k.shape[-2]
        attn_mask = attn_mask & torch.ones(lq, lk, dtype=torch.bool, device=q.device).tril(lk - lq)
        causal = False
    if causal and q.shape[-2] != k.shape[-2]:
        lq, lk = q.shape[-2], k.shape[-2]
        attn_mask, causal = torch.ones(lq, lk, dtype=torch.bool, device=q.device).tril(lk - lq), False
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=causal)
