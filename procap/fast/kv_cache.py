"""Fixed-shape key/value buffers for decoding: self-attention cache and the memory's cross-attention K/V.

Shapes never change after allocation and positions are device tensors, so the decoding step can be
captured once in a CUDA graph and replayed (gpt-fast's ``KVCache`` habit).
"""

from __future__ import annotations

import torch


class StaticKVCache:
    """Self-attention keys/values for every decoder layer, written one position per step.

    Args:
        layers: decoder layers L.
        batch: batch rows B (the graph bucket, padded).
        heads: attention heads H.
        max_steps: positions the cache holds T (``max_len - 1`` decoding steps).
        head_dim: Dh.
        dtype, device: buffer placement.

    Attributes:
        k, v: (L, B, H, T, Dh) buffers; entries past the current position hold stale data and are masked.
    """

    def __init__(
        self,
        layers: int,
        batch: int,
        heads: int,
        max_steps: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        shape = (layers, batch, heads, max_steps, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.max_steps = max_steps
        # Key index 0..T-1, compared against the position tensor to build the step's mask without a sync.
        self.key_index = torch.arange(max_steps, device=device)

    def update(self, layer: int, pos: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor) -> tuple:
        """Write one step's keys/values at ``pos`` and return the layer's full buffers.

        Args:
            layer: layer index.
            pos: (1,) long device tensor, the step being decoded.
            k_new, v_new: (B, H, 1, Dh).

        Returns:
            (k, v), each (B, H, T, Dh): views of the cache including the new entry.
        """
        k, v = self.k[layer], self.v[layer]
        k.index_copy_(2, pos, k_new)
        v.index_copy_(2, pos, v_new)
        return k, v

    def visible(self, pos: torch.Tensor) -> torch.Tensor:
        """(1, 1, 1, T) bool mask of the keys a query at ``pos`` may attend to (0..pos)."""
        return (self.key_index <= pos).view(1, 1, 1, -1)


class CrossKV:
    """The memory's cross-attention keys/values, computed once per caption batch and reused every step.

    Attributes:
        k, v: (L, B, H, N, Dh) buffers (N = (k + 2) * n memory tokens).
    """

    def __init__(
        self, layers: int, batch: int, heads: int, tokens: int, head_dim: int, dtype: torch.dtype, device: torch.device
    ) -> None:
        shape = (layers, batch, heads, tokens, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)

    def fill(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Copy a layer's (b, H, N, Dh) keys/values into the first b rows (the rest keep stale padding rows)."""
        self.k[layer, : k.shape[0]].copy_(k)
        self.v[layer, : v.shape[0]].copy_(v)
