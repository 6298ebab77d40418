"""Transformer pieces shared by the procedure encoder and the caption decoder.

Attention weights are separate ``q_proj`` / ``k_proj`` / ``v_proj`` / ``out_proj`` Linear layers (taming- and
checkpoint-compatible names). Every attention call goes through :func:`procap.kernels.attention.attention`, the single place
that runs a backend; each :class:`MultiHeadAttention` holds the backend name it was built with (timm's
``fused_attn`` habit), changed for a whole model with ``ProCap.set_attention_backend``.

The caption decoder's fused cached step does not go through these modules: it reads their weights in its own layout
(:mod:`procap.model.decoder_step`), and the tests compare it with the layers run over the whole prefix (which is
also what its readable cached form runs, ``CaptionDecoder.use_fused(False)``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Generic, TypeVar, overload

import torch
from torch import nn

from procap import kernels
from procap.kernels.attention import BACKENDS, attention, backend_for_mask

# Covariant, so that a stack of DecoderLayers is a stack of CrossAttentionLayers: nothing declared here takes an item
# (ModuleList's own mutators take any Module).
ItemT_co = TypeVar("ItemT_co", bound=nn.Module, covariant=True)


class ModuleStack(nn.ModuleList, Generic[ItemT_co]):
    """An ``nn.ModuleList`` of one kind of module, ``ModuleStack[DecoderLayer]``: at run time a plain ModuleList
    (the same state-dict keys, the same calls); to a type checker, indexing and iterating give ``ItemT_co``, where
    ModuleList says only ``Module`` and every attribute of a layer would read as ``Tensor | Module``."""

    def __init__(self, modules: Iterable[ItemT_co] = ()) -> None:
        super().__init__(modules)

    if TYPE_CHECKING:  # declarations only: the methods that run are ModuleList's

        def __iter__(self) -> Iterator[ItemT_co]: ...

        @overload
        def __getitem__(self, idx: slice) -> ModuleStack[ItemT_co]: ...

        @overload
        def __getitem__(self, idx: int) -> ItemT_co: ...

        def __getitem__(self, idx: int | slice) -> ItemT_co | ModuleStack[ItemT_co]: ...


def split_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """(B, L, D) -> (B, H, L, D / H): head h is the h-th contiguous chunk of the last dimension."""
    b, n, d = x.shape
    return x.view(b, n, heads, d // heads).transpose(1, 2)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """(B, H, L, Dh) -> (B, L, H * Dh)."""
    b, h, n, dh = x.shape
    return x.transpose(1, 2).reshape(b, n, h * dh)


class AttentionProjections(nn.Module):
    """The query, key, value and output projections of multi-head attention, its dropout and its backend.

    :class:`MultiHeadAttention` and the authors' :class:`procap.model.authors_decoder.AuthorsAttention` (bias-free
    projections, another score scale) are this with their own ``forward``.

    Args:
        dim: model width D.
        heads: number of heads; D must be divisible by it.
        dropout: dropout on the output projection.
        backend: :data:`procap.kernels.attention.BACKENDS` name; ``auto`` picks the fastest for each device and dtype.
        bias: whether the four projections have biases.
    """

    def __init__(self, dim: int, heads: int, dropout: float = 0.0, backend: str = "auto", bias: bool = True) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim {dim} is not divisible by heads {heads}")
        self.heads = heads
        self.q_proj = nn.Linear(dim, dim, bias=bias)
        self.k_proj = nn.Linear(dim, dim, bias=bias)
        self.v_proj = nn.Linear(dim, dim, bias=bias)
        self.out_proj = nn.Linear(dim, dim, bias=bias)
        self.dropout = nn.Dropout(dropout)
        self.set_backend(backend)

    def set_backend(self, backend: str) -> None:
        """Use ``backend`` (one of :data:`procap.kernels.attention.BACKENDS`) for every later call."""
        if backend not in BACKENDS:
            raise ValueError(f"unknown attention backend {backend!r}; choose one of {BACKENDS}")
        self.backend = backend

    def project_kv(self, context: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of ``context`` (B, Lk, D), each (B, H, Lk, Dh): what a cross-attention cache stores."""
        return split_heads(self.k_proj(context), self.heads), split_heads(self.v_proj(context), self.heads)


class MultiHeadAttention(AttentionProjections):
    """Multi-head (self- or cross-) attention with biased projections (:class:`AttentionProjections`)."""

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
        q = split_heads(self.q_proj(x), self.heads)
        k, v = self.project_kv(x if context is None else context)
        backend = backend_for_mask(self.backend, attn_mask)
        out = attention(q, k, v, causal=causal, attn_mask=attn_mask, backend=backend)  # (B, H, Lq, Dh)
        return self.dropout(self.out_proj(merge_heads(out)))


def quick_gelu(x: torch.Tensor) -> torch.Tensor:
    """CLIP's GELU approximation ``x * sigmoid(1.702 x)``; CLIP weights (and the authors' encoder) were trained with it."""
    return x * torch.sigmoid(1.702 * x)


ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu": torch.nn.functional.gelu,
    "quick_gelu": quick_gelu,
}


class FeedForward(nn.Module):
    """``fc1`` -> activation (``gelu`` or ``quick_gelu``) -> dropout -> ``fc2`` -> dropout."""

    def __init__(self, dim: int, hidden: int, dropout: float = 0.0, activation: str = "gelu") -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)
        self.dropout = nn.Dropout(dropout)
        self.activation = ACTIVATIONS[activation]
        # Opt-in (ProcedureEncoder.use_fused), inference only: fc1's bias and the GELU in the GEMM's epilogue,
        # ``torch._addmm_activation(use_gelu=True)``. That op's GELU is erf on the CPU but tanh-approximated on CUDA
        # (cuBLASLt's GELU epilogue, and ATen's fallback matches it), while this module's ``gelu`` is erf: on a GPU
        # the fused form is an approximation of the model, measured before it may become a default.
        self.gelu_epilogue = False
        # Opt-in likewise: the erf GELU in a Triton GEMM's epilogue (procap.kernels.linear_gelu), the model's
        # function on every device; the GEMM's summation order is its only difference.
        self.gelu_erf_epilogue = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fused = self._fused_fc1_gelu(x)
        h = self.activation(self.fc1(x)) if fused is None else fused
        return self.dropout(self.fc2(self.dropout(h)))

    def _fused_fc1_gelu(self, x: torch.Tensor) -> torch.Tensor | None:
        """``gelu(fc1(x))`` through the GELU epilogue chosen (inference, ``gelu`` modules only), else None."""
        if self.activation is not ACTIVATIONS["gelu"] or torch.is_grad_enabled():
            return None
        flat = x.reshape(-1, x.shape[-1])
        if self.gelu_erf_epilogue:
            h = kernels.linear_gelu(flat, self.fc1.weight, self.fc1.bias)
        elif self.gelu_epilogue:
            h = torch._addmm_activation(self.fc1.bias, flat, self.fc1.weight.t(), use_gelu=True)
        else:
            return None
        return h.view(*x.shape[:-1], -1)


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
