"""Building blocks of the taming-transformers VQGAN, with taming's attribute names.

The attribute names (``norm1``, ``conv1``, ``nin_shortcut``, ``q``/``k``/``v``/``proj_out``, ``conv``...) are part
of the contract: they make our state-dict keys equal to those of a taming ``.ckpt`` so a released checkpoint loads
with strict checks. Behaviour follows ``taming/modules/diffusionmodules/model.py`` (Esser et al., 2021):
GroupNorm(32, eps 1e-6), swish, pre-activation residual blocks, single-head spatial self-attention.

Every GroupNorm runs through ``procap.kernels.group_norm``: on CUDA one fused Triton op computes norm + swish (and,
between two chained residual blocks, the residual add before the norm) on channels-last activations; elsewhere its
reference is exactly ``swish(norm(x))``.
"""

from __future__ import annotations

from typing import overload

import torch
import torch.nn.functional as F
from torch import nn

from procap import kernels
from procap.kernels.attention import attention
from procap.model.layers import ModuleStack


def group_norm(channels: int) -> nn.GroupNorm:
    """taming's ``Normalize``: 32 groups, eps 1e-6, affine."""
    return nn.GroupNorm(num_groups=32, num_channels=channels, eps=1e-6, affine=True)


@overload
def norm_act(norm: nn.GroupNorm, x: torch.Tensor, silu: bool = ..., residual: None = ...) -> torch.Tensor: ...


@overload
def norm_act(
    norm: nn.GroupNorm, x: torch.Tensor, silu: bool = ..., *, residual: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]: ...


def norm_act(
    norm: nn.GroupNorm, x: torch.Tensor, silu: bool = True, residual: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """``swish(norm(x))`` (or ``norm(x)``) through the fused-op dispatch; with ``residual``, of ``x + residual``.

    Returns:
        (B, C, H, W), or ``(normalised, x + residual)`` when a residual is given.
    """
    return kernels.group_norm(x, norm.weight, norm.bias, norm.num_groups, norm.eps, silu, residual)


class ResnetBlock(nn.Module):
    """Pre-activation residual block: norm -> swish -> conv3x3, twice; 1x1 ``nin_shortcut`` when widths differ."""

    def __init__(self, in_channels: int, out_channels: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.in_channels, self.out_channels = in_channels, out_channels
        self.norm1 = group_norm(in_channels)
        self.conv1 = nn.Conv2d(in_channels, out_channels, kernel_size=3, stride=1, padding=1)
        self.norm2 = group_norm(out_channels)
        self.dropout = nn.Dropout(dropout)
        self.conv2 = nn.Conv2d(out_channels, out_channels, kernel_size=3, stride=1, padding=1)
        if in_channels != out_channels:
            self.nin_shortcut = nn.Conv2d(in_channels, out_channels, kernel_size=1, stride=1, padding=0)

    def forward(self, x: torch.Tensor | tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """(B, C_in, H, W) -> (B, C_out, H, W)."""
        shortcut, h = self.parts(x)
        return shortcut + h

    def parts(self, x: torch.Tensor | tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """The block's output before its residual add: ``(shortcut, h)`` with ``forward(x) == shortcut + h``.

        ``x`` may itself be such a pair (the previous block's parts): the add then happens inside the fused norm,
        which reads both tensors once and writes their sum for this block's shortcut.
        """
        if isinstance(x, tuple):
            h, shortcut = norm_act(self.norm1, x[0], residual=x[1])
        else:
            h, shortcut = norm_act(self.norm1, x), x
        h = self.conv2(self.dropout(norm_act(self.norm2, self.conv1(h))))
        if self.in_channels != self.out_channels:
            shortcut = self.nin_shortcut(shortcut)
        return shortcut, h


class AttnBlock(nn.Module):
    """Single-head self-attention over all H*W positions with 1x1-conv projections and a residual.

    Its backend is always ``auto``, not the one :meth:`procap.model.procap.ProCap.set_attention_backend` gives the
    encoder and decoder layers: the one head is as wide as the channels (512 in the paper's VQGAN), wider than
    flash-attn's 256, so a backend pinned for those layers (``flash``, ``sdpa_flash``) may not run it, while
    ``auto`` picks what runs for its width, device and dtype.
    """

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.norm = group_norm(channels)
        self.q = nn.Conv2d(channels, channels, kernel_size=1)
        self.k = nn.Conv2d(channels, channels, kernel_size=1)
        self.v = nn.Conv2d(channels, channels, kernel_size=1)
        self.proj_out = nn.Conv2d(channels, channels, kernel_size=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) -> (B, C, H, W); scores scaled by C^-1/2 as in taming."""
        b, c, h, w = x.shape
        y = norm_act(self.norm, x, silu=False)
        # (B, C, H, W) -> (B, 1, H*W, C): one head whose width is the channel count.
        q, k, v = (proj(y).reshape(b, 1, c, h * w).transpose(-2, -1) for proj in (self.q, self.k, self.v))
        out = attention(q, k, v)  # (B, 1, HW, C)
        out = out.transpose(-2, -1).reshape(b, c, h, w)
        return x + self.proj_out(out)


class Downsample(nn.Module):
    """Asymmetric zero pad (left 0, right 1, top 0, bottom 1) then 3x3 stride-2 conv: H -> H/2 exactly."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, kernel_size=3, stride=2, padding=0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.pad(x, (0, 1, 0, 1), mode="constant", value=0.0))


class Upsample(nn.Module):
    """Nearest-neighbour x2 then 3x3 conv."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, kernel_size=3, stride=1, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


class MidBlock(nn.Module):
    """``mid.block_1`` -> ``mid.attn_1`` -> ``mid.block_2`` at the lowest resolution (always has attention)."""

    def __init__(self, channels: int, dropout: float) -> None:
        super().__init__()
        self.block_1 = ResnetBlock(channels, channels, dropout)
        self.attn_1 = AttnBlock(channels)
        self.block_2 = ResnetBlock(channels, channels, dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block_2(self.attn_1(self.block_1(x)))


class Level(nn.Module):
    """One resolution level: ``block`` (res blocks), ``attn`` (possibly empty) and an optional resampler.

    In taming a level's attention list is either empty or has one AttnBlock after each res block; the
    resampler is stored as ``downsample`` (encoder) or ``upsample`` (decoder) so the keys read
    ``down.{i}.downsample.conv`` / ``up.{i}.upsample.conv``.
    """

    def __init__(self, widths: list[tuple[int, int]], with_attention: bool, dropout: float) -> None:
        super().__init__()
        self.block = ModuleStack([ResnetBlock(c_in, c_out, dropout) for c_in, c_out in widths])
        self.attn = ModuleStack([AttnBlock(c_out) for _, c_out in widths] if with_attention else [])
        # The resampler the encoder or decoder sets; None is a plain attribute, so no state-dict key until it is set.
        self.downsample: Downsample | None = None
        self.upsample: Upsample | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        value: torch.Tensor | tuple[torch.Tensor, torch.Tensor] = x
        for i, block in enumerate(self.block):
            # A block followed directly by another hands over its unsummed parts (the add fuses into the next norm).
            chained = i + 1 < len(self.block) and not len(self.attn)
            value = block.parts(value) if chained else block(value)
            if len(self.attn):
                value = self.attn[i](value)
        assert isinstance(value, torch.Tensor)  # the last block always sums its parts
        out = value
        if self.downsample is not None:
            out = self.downsample(out)
        if self.upsample is not None:
            out = self.upsample(out)
        return out
