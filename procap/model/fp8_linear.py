"""FP8 inference form of the procedure encoder's GEMMs: :class:`Fp8Linear` in place of ``nn.Linear``.

``quantize_encoder_linears`` swaps the q/k/v/out projections and fc1/fc2 of every encoder layer for
:class:`Fp8Linear`, whose weight is quantised once, per output channel (:func:`procap.kernels.fp8.quantize_weight`).
Each call quantises its input per row and runs :func:`procap.kernels.fp8.fp8_linear` (``torch._scaled_mm`` on an
FP8 GPU, the fake-quant reference elsewhere). The three projections of one attention read the same normed input: the
encoder's linears share one :class:`RowCache`, so that input is quantised once, not three times.

Only the Captioner builds this form (``precision="fp8"``, :mod:`procap.fast.settings`): it is an inference form of
a model that trained in bf16/fp32, on a copy of the model, and not undone (a state dict of it has other keys).
"""

from __future__ import annotations

import torch
from torch import nn

from procap.kernels import fp8


class RowCache:
    """The last input quantised per row, reused while the same tensor (same version) comes again.

    Holds one activation at a time; a tensor written in place since (its version moved) is quantised again.
    """

    def __init__(self) -> None:
        self._key: tuple[int, int, int] | None = None
        self._source: torch.Tensor | None = None
        self._rows: fp8.Quantized | None = None

    def rows(self, x: torch.Tensor) -> fp8.Quantized:
        """Per-row :class:`~procap.kernels.fp8.Quantized` of ``x`` (..., K) flattened to (M, K)."""
        key = (x.data_ptr(), x._version, x.numel())
        if self._source is not x or self._key != key or self._rows is None:
            self._rows = fp8.quantize_rows(x.reshape(-1, x.shape[-1]))
            self._source, self._key = x, key
        return self._rows

    def clear(self) -> None:
        """Let go of the activation held (the end of a forward)."""
        self._key = self._source = self._rows = None


class Fp8Linear(nn.Module):
    """``nn.Linear`` with an e4m3 weight and per-output-channel scales; inference only.

    The codes and scales are buffers kept as bytes (``uint8`` views): a model cast such as ``.to(torch.bfloat16)``
    moves them with the model but never re-types them. The bias follows the model's dtype, as the output does.

    Args:
        linear: the layer to quantise (its weight must be finite).
        impl: :data:`procap.kernels.fp8.GEMM_IMPLS` name.
        cache: the :class:`RowCache` shared with the layers that read the same inputs.
        name: the layer's name, for the error a non-finite weight raises.
    """

    weight_bits: torch.Tensor  # (out, in) uint8: the e4m3 codes' bytes
    scale_bits: torch.Tensor  # (out, 4) uint8: the fp32 scales' bytes

    def __init__(self, linear: nn.Linear, impl: str, cache: RowCache, name: str = "weight") -> None:
        super().__init__()
        quantized = fp8.quantize_weight(linear.weight.detach(), name)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("weight_bits", quantized.codes.view(torch.uint8))
        self.register_buffer("scale_bits", quantized.scale.contiguous().view(torch.uint8))
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone(), requires_grad=False)
        self.impl, self.cache = impl, cache

    @property
    def weight_e4m3(self) -> fp8.Quantized:
        """The weight's codes (out, in) and fp32 scales (out, 1)."""
        return fp8.Quantized(self.weight_bits.view(fp8.E4M3), self.scale_bits.view(torch.float32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and x.requires_grad:
            raise RuntimeError("Fp8Linear is an inference form: it has no backward")
        rows = self.cache.rows(x)
        out = fp8.fp8_linear(rows, self.weight_e4m3, self.bias, x.dtype, self.impl)
        return out.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, e4m3, impl={self.impl}"


ENCODER_LINEARS = (("attn", "q_proj"), ("attn", "k_proj"), ("attn", "v_proj"), ("attn", "out_proj"), ("mlp", "fc1"),
                   ("mlp", "fc2"))  # fmt: skip


def quantize_encoder_linears(encoder: nn.Module, impl: str) -> int:
    """Swap the six GEMMs of every layer of ``encoder.layers`` for :class:`Fp8Linear` (layers already swapped kept).

    Args:
        encoder: a :class:`procap.model.encoder.ProcedureEncoder`.
        impl: the GEMM implementation every swapped layer runs.

    Returns:
        How many layers were quantised now.
    """
    cache, swapped = RowCache(), 0
    layers = encoder.layers
    assert isinstance(layers, nn.ModuleList)
    for index, layer in enumerate(layers):
        for part_name, name in ENCODER_LINEARS:
            part = getattr(layer, part_name)
            linear = getattr(part, name)
            if isinstance(linear, Fp8Linear):
                linear.impl = impl
                continue
            setattr(part, name, Fp8Linear(linear, impl, cache, f"encoder.layers.{index}.{part_name}.{name}.weight"))
            swapped += 1
    if swapped:
        encoder.register_forward_hook(lambda *_: cache.clear())  # hold no activation between calls
    return swapped


def is_quantized(encoder: nn.Module) -> bool:
    """Whether :func:`quantize_encoder_linears` swapped the encoder's GEMMs."""
    return any(isinstance(m, Fp8Linear) for m in encoder.modules())
