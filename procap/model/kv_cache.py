"""Fixed-shape key/value buffers for cached decoding (gpt-fast's ``KVCache`` habit).

Shapes never change after allocation and the decoding position is a device tensor, so a decoding step that reads
and writes only these buffers can be captured once in a CUDA graph and replayed. Two kinds of use:

- self-attention: :meth:`KVCache.update` writes the keys/values of the positions being decoded at ``input_pos``
  and :meth:`KVCache.visible` masks the keys after each query (entries past it hold stale data);
- cross-attention: :meth:`KVCache.fill` stores the memory's keys/values once per caption batch ("prefill").

:class:`PrefixCache` is the readable form's stand-in (``CaptionDecoder.use_fused(False)``): no keys or values, the
inputs themselves, which every step runs through the decoder's readable forward again.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


class KVCache:
    """Keys and values of one attention layer for ``batch`` rows and ``length`` positions.

    Args:
        batch: rows B (a batch bucket: real rows first, padding rows after).
        heads: attention heads H.
        length: positions T (decoding steps for self-attention, memory tokens for cross-attention).
        head_dim: Dh.
        dtype, device: buffer placement (the attention weights' dtype and device).

    Attributes:
        k, v: (B, H, T, Dh) buffers.
        key_index: (T,) int64 positions 0..T-1, compared with ``input_pos`` to build masks without a host sync.
    """

    def __init__(
        self, batch: int, heads: int, length: int, head_dim: int, dtype: torch.dtype, device: torch.device | str
    ) -> None:
        shape = (batch, heads, length, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.key_index = torch.arange(length, device=device)

    def update(
        self, input_pos: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write keys/values (B, H, L, Dh) at positions ``input_pos`` (L,) and return the full (B, H, T, Dh) buffers."""
        self.k.index_copy_(2, input_pos, k_new)
        self.v.index_copy_(2, input_pos, v_new)
        return self.k, self.v

    def visible(self, input_pos: torch.Tensor) -> torch.Tensor:
        """(1, 1, L, T) bool mask: the query at ``input_pos[i]`` may attend to keys 0..input_pos[i]."""
        return (self.key_index[None, :] <= input_pos[:, None])[None, None]

    def fill(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store keys/values (b, H, T, Dh) in the first b rows; rows b..B-1 keep their (finite, stale) contents."""
        self.k[: k.shape[0]].copy_(k)
        self.v[: v.shape[0]].copy_(v)


@dataclass
class DecoderCache:
    """One :class:`KVCache` per decoder layer for self-attention and one for cross-attention to the memory."""

    self_attn: list[KVCache]
    cross_attn: list[KVCache]

    def reorder_rows(self, rows: torch.Tensor) -> None:
        """Row i of every self-attention cache becomes row ``rows[i]`` (beam search follows its hypotheses)."""
        for cache in self.self_attn:
            cache.k.copy_(cache.k.index_select(0, rows))
            cache.v.copy_(cache.v.index_select(0, rows))


class PrefixCache:
    """The inputs of a whole-prefix pass per step, in fixed-shape buffers (so a graph can capture the step too).

    Args:
        batch: rows B; max_len: caption length T including BOS; memory_len: memory tokens N; dim: D.
        dtype, device: the decoder weights' placement.

    Attributes:
        sequence: (B, T) int64 ids, each step's input written at its position (:meth:`write`); what lies after the
            position being decoded is stale or zero, which a causal decoder never reads.
        memory: (B, N, D) the memory of the batch (:meth:`fill`).
    """

    def __init__(
        self, batch: int, max_len: int, memory_len: int, dim: int, dtype: torch.dtype, device: torch.device | str
    ) -> None:
        self.sequence = torch.zeros(batch, max_len, dtype=torch.long, device=device)
        self.memory = torch.zeros(batch, memory_len, dim, dtype=dtype, device=device)

    def fill(self, memory: torch.Tensor) -> None:
        """Store a memory (b, N, D) in the first b rows; rows b..B-1 keep their (finite, stale) contents."""
        self.memory[: memory.shape[0]].copy_(memory)

    def write(self, input_pos: torch.Tensor, tokens: torch.Tensor) -> None:
        """Put the ids (B,) at position ``input_pos`` (1,) of every row."""
        self.sequence.index_copy_(1, input_pos, tokens[:, None])

    def reorder_rows(self, rows: torch.Tensor) -> None:
        """Row i becomes row ``rows[i]`` (beam search follows its hypotheses)."""
        self.sequence.copy_(self.sequence.index_select(0, rows))
