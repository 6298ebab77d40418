"""The VQGAN encoder's fused inference form: bias-free convolutions, each bias added where it is read.

On CUDA, ATen runs a biased cuDNN convolution as the convolution followed by a separate broadcast ``add_`` of the
bias, which ATen's non-vectorised elementwise kernel executes: 36 such passes were 18 % of the first H100 profile
(docs/gpu.md, "What is in the way" and "Prepared, not yet measured"). :class:`FusedVQGANEncoder` computes what
:class:`procap.model.vqgan.Encoder` computes, with the same modules and state-dict keys, but:

- every convolution runs without its bias, and the bias travels with the output (:class:`_Pending`) until the
  next op that reads that tensor adds it: the group norm's ``in_bias`` (statistics and apply kernels), the
  residual block's output add (``procap.kernels.bias_add``: shortcut + h + bias in one pass), or a GEMM epilogue;
- the 1x1 convolutions (``nin_shortcut``; the attention's ``q``/``k``/``v``/``proj_out``, q/k/v merged into one
  GEMM) run as ``F.linear`` over the channels-last tensor viewed as (B, H, W, C), which needs no copy and adds the
  bias in cuBLAS's epilogue;
- ``Downsample``'s asymmetric ``F.pad`` + 3x3 stride-2 convolution runs as one convolution with the 3x3 kernel
  zero-extended to 4x4 (``W4[..., 1:, 1:] = W3``) and padding 1: the same taps on the same pixels, for any input
  size, with no padded copy of the activation (the zero taps are hardware FLOPs, not model FLOPs: benchmarks count
  model FLOPs on the reference module);
- ``conv_in`` reads its 3-channel input zero-padded to 8 channels with zero weights, so cuDNN's kernels for
  16-byte-aligned channels apply; or, opt-in (``conv_in_stats``), ``procap.kernels.conv_in_norm`` runs ``conv_in``
  on the 3 channels as a Triton convolution that adds the bias and writes the first norm's statistics, so that
  norm skips its statistics pass (a read and a write of the 128-channel output; docs/gpu.md, "Prepared for issue
  51"): inference only, with an input that requires grad the op's reference runs;
- every GroupNorm runs the fused kernels along the path of the ``group_norm`` option
  (``procap.kernels.groupnorm.GROUP_NORM_PATHS``: the three chunked passes by default; ``"persistent"`` and
  ``"single_kernel"`` are opt-in until a GPU has measured them, docs/gpu.md "Prepared for issue 51").

The readable encoder (``procap.model.vqgan.Encoder``) stays the reference; the VQGAN chooses this form with
:meth:`procap.model.vqgan.VQGAN.use_fused` (``procap.fast.Captioner`` does by default), and the tests
compare the two in fp32, bf16 and under the Triton interpreter. Inference only (eval mode; dropout is not applied).
This module reads the encoder it is given and imports nothing of :mod:`procap.model.vqgan`, which builds it, but its
class names for the type checker.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from procap import kernels
from procap.core.errors import ProCapError, shown
from procap.kernels.attention import attention
from procap.kernels.groupnorm import GROUP_NORM_PATHS
from procap.model.vqgan_blocks import AttnBlock, Downsample, ResnetBlock

if TYPE_CHECKING:  # the VQGAN imports this module to build it
    from procap.model.vqgan import Encoder

INPUT_CHANNELS = 8  # conv_in's input padded to 8 channels: 16 bytes per pixel in bf16


@dataclass
class _Pending:
    """A tensor whose value is ``(tensor + bias[c]) + residual``: the adds not yet done, left to the next reader.

    ``normed``: the first residual block's ``norm1`` output of ``tensor``, made with it (``conv_in_stats``).
    """

    tensor: torch.Tensor
    bias: torch.Tensor | None = None
    residual: torch.Tensor | None = None
    normed: torch.Tensor | None = None


def _bias(conv: nn.Conv2d) -> torch.Tensor:
    """A convolution's bias, which the fused form adds where the output is read: taming's convolutions all have one."""
    if conv.bias is None:
        raise ValueError(
            "FusedVQGANEncoder reads taming's VQGAN, whose convolutions all have biases; this one has none"
        )
    return conv.bias


def _padded_weight(weight: torch.Tensor, input_channels: int | None) -> torch.Tensor:
    """``conv_in``'s weight with zero input channels up to ``input_channels`` (None, or fewer: as it is)."""
    if input_channels is None or input_channels <= weight.shape[1]:
        return weight
    return torch.cat([weight, weight.new_zeros(weight.shape[0], input_channels - weight.shape[1], 3, 3)], 1)


def _key(module_name: str) -> str:
    """A buffer-name suffix for the attention block at ``module_name`` (``mid.attn_1`` -> ``mid_attn_1``)."""
    return module_name.replace(".", "_")


def pointwise_conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """A 1x1 convolution as a GEMM with the bias in its epilogue: (B, C_in, H, W) -> (B, C_out, H, W).

    ``x.permute(0, 2, 3, 1)`` of a channels-last tensor is a contiguous (B, H, W, C) view and the result comes back
    channels-last, so on CUDA nothing is copied.
    """
    return F.linear(x.permute(0, 2, 3, 1), weight.flatten(1), bias).permute(0, 3, 1, 2)


def downsample_weight_4x4(weight: torch.Tensor) -> torch.Tensor:
    """The 3x3 stride-2 kernel after taming's (0, 1, 0, 1) zero pad, as a 4x4 kernel for padding 1.

    ``conv(F.pad(x, (0, 1, 0, 1)), W3, stride=2)`` reads pixels ``2i + a`` for ``a`` in 0..2 (and the zero pad past
    the end); ``conv(x, W4, stride=2, padding=1)`` reads ``2i + a - 1`` for ``a`` in 0..3, with ``W4[..., 0, :]``
    and ``W4[..., :, 0]`` zero: the same taps, and the same output size for any input size.
    """
    out = weight.new_zeros(*weight.shape[:2], 4, 4)
    out[..., 1:, 1:] = weight
    return out


class FusedVQGANEncoder(nn.Module):
    """:class:`procap.model.vqgan.Encoder` for inference, with every convolution bias-free (module docstring).

    Args:
        encoder: the model's :class:`procap.model.vqgan.Encoder`; its modules are shared (so the state-dict keys are
            the same), not copied.
        downsample_4x4: the pad + 3x3 stride-2 ``Downsample`` as a 4x4 convolution with padding 1 (else the pad
            and the bias-free 3x3 convolution).
        input_channels: pad the image channels to this many (zero weights) before ``conv_in``; None keeps 3.
        channels_last: run in channels-last (the CUDA path), which makes the 1x1 GEMMs copy-free.
        group_norm: the fused GroupNorm's path, one of ``GROUP_NORM_PATHS`` (``procap.kernels.group_norm``'s
            ``path``); the outputs agree up to fp32 summation order.
        conv_in_stats: run ``conv_in`` and the first norm as ``procap.kernels.conv_in_norm`` (the images' own channels;
            ``input_channels`` is then not used): opt-in until a GPU has timed it.

    Attributes:
        reference: the wrapped :class:`Encoder` (not a submodule: its children are this module's children).
    """

    reference: Encoder  # set with object.__setattr__, outside the module tree
    conv_in_weight: torch.Tensor  # registered buffers

    def __init__(
        self,
        encoder: Encoder,
        *,
        downsample_4x4: bool = True,
        input_channels: int | None = INPUT_CHANNELS,
        channels_last: bool = False,
        group_norm: str = "chunked",
        conv_in_stats: bool = False,
    ) -> None:
        super().__init__()
        if group_norm not in GROUP_NORM_PATHS:
            raise ProCapError(
                f"The fused VQGAN's group_norm option must be one of {', '.join(GROUP_NORM_PATHS)}, "
                f"got {shown(group_norm)}."
            )
        if conv_in_stats and not len(encoder.down[0].block):
            raise ProCapError("conv_in_stats needs a residual block after conv_in; this VQGAN's first level has none.")
        self.group_norm = group_norm
        self.conv_in, self.down, self.mid = encoder.conv_in, encoder.down, encoder.mid
        self.norm_out, self.conv_out = encoder.norm_out, encoder.conv_out
        object.__setattr__(self, "reference", encoder)  # kept out of the module tree: no second set of keys
        self.downsample_4x4, self.channels_last, self.conv_in_stats = downsample_4x4, channels_last, conv_in_stats
        self.train(encoder.training)
        layout = torch.channels_last if channels_last else torch.contiguous_format
        # conv_in_stats: the Triton convolution reads the images' own channels and a contiguous weight
        channels, weight_layout = (None, torch.contiguous_format) if conv_in_stats else (input_channels, layout)
        weight = _padded_weight(self.conv_in.weight.detach(), channels)
        self.register_buffer("conv_in_weight", weight.contiguous(memory_format=weight_layout), persistent=False)
        for i, level in enumerate(self.down):
            if level.downsample is not None and downsample_4x4:
                w4 = downsample_weight_4x4(level.downsample.conv.weight.detach())
                self.register_buffer(f"downsample_weight_{i}", w4.contiguous(memory_format=layout), persistent=False)
        for name, module in self.named_modules():
            if isinstance(module, AttnBlock):  # q, k, v as one (3C, C) GEMM
                qkv_w = torch.cat([p.weight.detach().flatten(1) for p in (module.q, module.k, module.v)])
                qkv_b = torch.cat([_bias(p).detach() for p in (module.q, module.k, module.v)])
                self.register_buffer(f"qkv_weight_{_key(name)}", qkv_w, persistent=False)
                self.register_buffer(f"qkv_bias_{_key(name)}", qkv_b, persistent=False)

    # -- the ops --------------------------------------------------------------------------------------------------
    @staticmethod
    def _materialise(value: _Pending) -> torch.Tensor:
        """The pending adds done: one pass (``bias_add``) when a bias is pending, a plain add for a residual alone."""
        if value.bias is not None:
            return kernels.bias_add(value.tensor, value.bias, value.residual)
        return value.tensor if value.residual is None else value.tensor + value.residual

    def _norm(self, norm: nn.GroupNorm, value: _Pending, silu: bool = True) -> torch.Tensor:
        """``act(norm(v))`` of the pending value v, its adds done inside the fused norm."""
        args = (norm.weight, norm.bias, norm.num_groups, norm.eps, silu)
        if value.bias is None and value.residual is None:
            return kernels.group_norm(value.tensor, *args, path=self.group_norm)
        out = kernels.group_norm(value.tensor, *args, value.residual, in_bias=value.bias, path=self.group_norm)
        return out[0] if isinstance(out, tuple) else out

    def _norm_and_sum(self, norm: nn.GroupNorm, value: _Pending) -> tuple[torch.Tensor, torch.Tensor]:
        """``(act(norm(v)), v)`` of the pending value v: the fused norm does its adds and writes v for the shortcut."""
        if value.normed is not None:  # conv_in_stats: the first block's norm1 ran with conv_in
            return value.normed, value.tensor
        args = (norm.weight, norm.bias, norm.num_groups, norm.eps, True)
        if value.bias is None and value.residual is None:
            return kernels.group_norm(value.tensor, *args, path=self.group_norm), value.tensor
        return kernels.group_norm(
            value.tensor, *args, value.residual, in_bias=value.bias, return_sum=True, path=self.group_norm
        )

    @staticmethod
    def _conv3x3(x: torch.Tensor, conv: nn.Conv2d) -> torch.Tensor:
        return F.conv2d(x, conv.weight, None, conv.stride, conv.padding)

    def _resnet(self, block: ResnetBlock, value: _Pending) -> _Pending:
        """The block's output as ``(conv2 out, conv2 bias, shortcut)``: nothing summed yet."""
        h, shortcut = self._norm_and_sum(block.norm1, value)
        h = self._conv3x3(h, block.conv1)
        h = self._norm(block.norm2, _Pending(h, block.conv1.bias))
        h = self._conv3x3(h, block.conv2)
        if block.in_channels != block.out_channels:
            shortcut = pointwise_conv(shortcut, block.nin_shortcut.weight, block.nin_shortcut.bias)
        return _Pending(h, block.conv2.bias, shortcut)

    def _attention(self, name: str, block: AttnBlock, x: torch.Tensor) -> torch.Tensor:
        """taming's single-head spatial attention with q/k/v in one GEMM; x + proj_out(attention)."""
        b, c, h, w = x.shape
        key = _key(name)
        norm = block.norm
        y = kernels.group_norm(x, norm.weight, norm.bias, norm.num_groups, norm.eps, path=self.group_norm)
        qkv = F.linear(y.permute(0, 2, 3, 1), getattr(self, f"qkv_weight_{key}"), getattr(self, f"qkv_bias_{key}"))
        q, k, v = qkv.view(b, 1, h * w, 3 * c).split(c, dim=-1)  # (B, 1, HW, C) each, one head of width C
        out = F.linear(attention(q, k, v), block.proj_out.weight.flatten(1), block.proj_out.bias)
        return x + out.view(b, h, w, c).permute(0, 3, 1, 2)

    def _downsample(self, index: int, downsample: Downsample, x: torch.Tensor) -> _Pending:
        conv = downsample.conv
        if self.downsample_4x4:
            return _Pending(F.conv2d(x, getattr(self, f"downsample_weight_{index}"), None, 2, 1), conv.bias)
        return _Pending(F.conv2d(F.pad(x, (0, 1, 0, 1)), conv.weight, None, 2, 0), conv.bias)

    def _input(self, images: torch.Tensor) -> torch.Tensor:
        """Images in the run's layout, zero-padded to ``conv_in_weight``'s input channels."""
        layout = torch.channels_last if self.channels_last else torch.contiguous_format
        channels = self.conv_in_weight.shape[1]
        if images.shape[1] == channels:
            return images.contiguous(memory_format=layout)
        b, _, h, w = images.shape
        padded = images.new_zeros(b, channels, h, w).contiguous(memory_format=layout)
        padded[:, : images.shape[1]] = images
        return padded

    def _conv_in(self, images: torch.Tensor) -> _Pending:
        """``conv_in`` of the prepared images, its bias pending; with ``conv_in_stats`` also the first norm's output."""
        if not self.conv_in_stats:
            return _Pending(F.conv2d(images, self.conv_in_weight, None, 1, 1), self.conv_in.bias)
        norm = self.down[0].block[0].norm1
        args = (norm.weight, norm.bias, norm.num_groups, norm.eps, True)
        normed, s = kernels.conv_in_norm(images, self.conv_in_weight, _bias(self.conv_in), *args)
        return _Pending(s, normed=normed)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """(B, 3, S, S) -> (B, z_channels, S/f, S/f), equal to the reference encoder's output up to rounding."""
        if self.training:
            raise RuntimeError(
                "FusedVQGANEncoder is an inference path: call .eval() (training uses the model's Encoder)"
            )
        value = self._conv_in(self._input(images))
        for index, level in enumerate(self.down):
            for i, block in enumerate(level.block):
                value = self._resnet(block, value)
                if len(level.attn):
                    value = _Pending(self._attention(f"down.{index}.attn.{i}", level.attn[i], self._materialise(value)))
            if level.downsample is not None:
                value = self._downsample(index, level.downsample, self._materialise(value))
        value = self._resnet(self.mid.block_1, value)
        value = _Pending(self._attention("mid.attn_1", self.mid.attn_1, self._materialise(value)))
        value = self._resnet(self.mid.block_2, value)
        h = self._norm(self.norm_out, value)
        return kernels.bias_add(self._conv3x3(h, self.conv_out), _bias(self.conv_out))
