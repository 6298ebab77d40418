"""Fixed-shape key/value buffers for cached decoding (gpt-fast's ``KVCache`` habit).

Shapes never change after allocation and the decoding position is a device tensor, so a decoding step that reads
and writes only these buffers can be captured once in a CUDA graph and replayed. Two kinds of use:

- self-attention: :meth:`KVCache.update` writes the keys/values of the positions being decoded at ``input_pos``
  and :meth:`KVCache.visible` masks the keys after each query (entries past it hold stale data);
- cross-attention: :meth:`KVCache.fill` stores the memory's keys/values once per caption batch ("prefill").
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
