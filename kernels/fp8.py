"""FP8 (e4m3) numerics for inference: scales, rounding, saturation, and the scaled GEMM with its plain PyTorch reference.

The format is ``torch.float8_e4m3fn``: 4 exponent bits, 3 mantissa bits, no infinities, one NaN, largest finite value
448, smallest subnormal 2**-9. A tensor is stored as e4m3 *codes* and an fp32 *scale*, its value ``codes * scale``.

Granularity, chosen for what Hopper's ``torch._scaled_mm`` takes (its row-wise mode: one fp32 scale per row of the
left operand and one per column of the right one, bf16 out) and for what the producing kernel can compute in the
pass that writes the activation:

- weights: one scale per output channel (per row of ``nn.Linear.weight``), ``amax / 448``, quantised once;
- activations: one scale per row (per token), ``amax / 448`` of that row. Not per tensor: a per-tensor scale needs
  the whole tensor's amax before any row can be written, a second pass (or a grid-wide sync) that the one-program-
  per-row add + LayerNorm kernel avoids, and ``_scaled_mm`` does not mix a per-tensor scale on one side with
  per-channel scales on the other. Per row also keeps one outlier token from flattening every other token's codes.

Rounding and range (:func:`quantize`): ``x / scale`` in fp32, clamped to +-448 (saturation: never NaN for a finite
value beyond the range, whichever way a torch version casts it), then cast, which rounds to nearest even (so a value
halfway below the smallest subnormal becomes 0). A scale is never below ``MIN_SCALE``: an all-zero row gets codes 0.

Non-finite values: a weight with inf or NaN is refused (:func:`quantize_weight`, :class:`ProCapError`: a broken
weight file, not something to round). An activation row holding inf or NaN gets a NaN scale, so the whole row
dequantises to NaN: non-finite activations stay visible downstream (as they would in bf16) instead of saturating
to +-448 and leaving a finite, wrong caption.

The GEMM (:func:`fp8_linear`): ``y = (x_codes @ w_codes.T) * x_scale * w_scale + bias``, fp32 accumulation, output in
the compute dtype. ``fp8_linear_ref`` is the truth on every device (dequantise both operands to fp32, matmul, add
the bias in fp32, round once); ``fp8_linear_scaled_mm`` runs ``torch._scaled_mm`` (cuBLASLt / CUTLASS on sm_89+;
the CPU build has it too, which is how its arguments are tested here). Why ``_scaled_mm`` and not a Triton FP8 GEMM:
the encoder's GEMMs are large and regular (25,088 x 768 x 768 / 3,072 at batch 32), where the vendor kernels already
run bf16 at ~90 % of peak, capture in CUDA graphs and need no autotuning of ours; a Triton GEMM would be ours to
maintain for no expected gain.

:func:`add_layer_norm_e4m3` is the contract of the GPU goal "activations quantised by the kernel that produces them":
the residual add + LayerNorm of :func:`procap.kernels.add_layer_norm` writing e4m3 codes and a row scale instead of
bf16. Written here row by row in plain PyTorch (what one kernel program computes, statistics in fp32); it agrees
with ``quantize_rows(add_layer_norm_ref(...))``, what the FP8 linear computes from the bf16 norm today, up to the
fp32 rounding of the statistics (the tests: equal scales, codes at most one e4m3 step apart), the tolerance every
fused op has against its reference.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from procap.core.errors import ProCapError

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0  # largest finite e4m3fn value
MIN_SCALE = torch.finfo(torch.float32).tiny  # a scale never below this: all-zero rows quantise to 0, not 0/0
GEMM_IMPLS = ("reference", "scaled_mm")
MIN_CAPABILITY = (8, 9)  # FP8 tensor cores: Ada (sm_89) and Hopper (sm_90)


class Quantized(NamedTuple):
    """e4m3 ``codes`` and the fp32 ``scale`` that multiplies them, broadcast over the last dimension ((..., 1))."""

    codes: torch.Tensor
    scale: torch.Tensor


def scale_from_amax(amax: torch.Tensor) -> torch.Tensor:
    """fp32 scale ``amax / 448`` (at least :data:`MIN_SCALE`); NaN where ``amax`` is not finite."""
    amax = amax.float()
    scale = (amax / E4M3_MAX).clamp_min(MIN_SCALE)
    return torch.where(torch.isfinite(amax), scale, torch.full_like(scale, float("nan")))


def quantize(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """e4m3 codes of ``x / scale``: fp32 division, saturated to +-448, rounded to nearest even by the cast."""
    return (x.float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)


def dequantize(quantized: Quantized) -> torch.Tensor:
    """The fp32 values ``codes * scale``."""
    return quantized.codes.float() * quantized.scale


def quantize_rows(x: torch.Tensor) -> Quantized:
    """Per-row (last dimension) quantisation of an activation: one scale per row, ``amax / 448`` of the row."""
    scale = scale_from_amax(x.detach().abs().amax(dim=-1, keepdim=True))
    return Quantized(quantize(x, scale), scale)


def quantize_weight(weight: torch.Tensor, name: str = "weight") -> Quantized:
    """Per-output-channel quantisation of a (out, in) weight; refuses inf / NaN (a broken weight, not a range).

    Raises:
        ProCapError: ``weight`` holds a non-finite value, naming ``name``.
    """
    if not bool(torch.isfinite(weight).all()):
        raise ProCapError(f"{name} holds inf or NaN and cannot be quantised to FP8.")
    return quantize_rows(weight)


def fp8_linear_ref(x: Quantized, weight: Quantized, bias: torch.Tensor | None, out_dtype: torch.dtype) -> torch.Tensor:
    """Fake-quant GEMM, the truth: both operands dequantised to fp32, fp32 matmul, the bias added in fp32, one rounding.

    Args:
        x: (M, K) codes with an (M, 1) scale; weight: (N, K) codes with an (N, 1) scale.
        bias: (N,) or None; out_dtype: the output's dtype.

    Returns:
        (M, N) in ``out_dtype``.
    """
    y = dequantize(x) @ dequantize(weight).t()
    if bias is not None:
        y = y + bias.float()
    return y.to(out_dtype)


def fp8_linear_scaled_mm(
    x: Quantized, weight: Quantized, bias: torch.Tensor | None, out_dtype: torch.dtype
) -> torch.Tensor:
    """:func:`fp8_linear_ref` through ``torch._scaled_mm``'s row-wise mode (x scales per row, weight scales per
    column of ``weight.T``, which is column-major as cuBLASLt wants it). K and N must be multiples of 16."""
    return torch._scaled_mm(
        x.codes,
        weight.codes.t(),
        scale_a=x.scale,
        scale_b=weight.scale.t(),
        bias=None if bias is None else bias.to(out_dtype),
        out_dtype=out_dtype,
    )


def scaled_mm_problem(device: torch.device, out_dtype: torch.dtype, shape: tuple[int, int] | None = None) -> str | None:
    """Why ``torch._scaled_mm`` cannot run an FP8 linear here, in a few words, or None when it can.

    ``shape``: the weight's (N, K) when known. Off CUDA the CPU build's ``_scaled_mm`` would run, but the reference is
    the CPU's implementation (the CPU's FP8 GEMM is no faster, and the reference is what the tests compare with).
    """
    if device.type != "cuda":
        return f"{device.type} runs the reference"
    capability = torch.cuda.get_device_capability(device)
    if capability < MIN_CAPABILITY:
        return f"compute capability {capability[0]}.{capability[1]} has no FP8 tensor cores (8.9 or newer)"
    if out_dtype != torch.bfloat16:
        return f"row-wise scaled GEMMs write bf16, not {out_dtype}"
    if shape is not None and (shape[0] % 16 or shape[1] % 16):
        return f"a {shape[0]} x {shape[1]} weight is not a multiple of 16 on both sides"
    return None


def fp8_linear(
    x: torch.Tensor | Quantized,
    weight: Quantized,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype | None = None,
    impl: str = "reference",
) -> torch.Tensor:
    """``x @ dequantised(weight).T + bias`` with FP8 operands; ``x`` (..., K) is quantised per row unless it already is.

    Args:
        x: the activation (quantised here, per row) or its :class:`Quantized` form.
        weight: (N, K) per-output-channel :class:`Quantized` (:func:`quantize_weight`).
        bias: (N,) or None.
        out_dtype: the output's dtype (None: x's dtype; bf16 for an already quantised x).
        impl: ``"reference"`` (:func:`fp8_linear_ref`) or ``"scaled_mm"`` (:func:`fp8_linear_scaled_mm`).

    Returns:
        (..., N).
    """
    if impl not in GEMM_IMPLS:
        raise ValueError(f"unknown FP8 GEMM implementation {impl!r}; choose one of {', '.join(GEMM_IMPLS)}")
    if isinstance(x, Quantized):
        rows, lead = x, x.codes.shape[:-1]
        out_dtype = out_dtype or torch.bfloat16
    else:
        lead, out_dtype = x.shape[:-1], out_dtype or x.dtype
        rows = quantize_rows(x.reshape(-1, x.shape[-1]))
    rows = Quantized(rows.codes.reshape(-1, rows.codes.shape[-1]), rows.scale.reshape(-1, 1))
    gemm = fp8_linear_scaled_mm if impl == "scaled_mm" else fp8_linear_ref
    return gemm(rows, weight, bias, out_dtype).view(*lead, -1)


def add_layer_norm_e4m3(
    x: torch.Tensor, h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float
) -> Quantized:
    """``x += h`` in place, then the LayerNorm of each row written as e4m3 codes and one scale per row.

    One row at a time as a kernel program computes it: the sum rounded to x's dtype (stored, as the eager add leaves
    it), fp32 mean and biased variance, the affine norm rounded to x's dtype (what the bf16 path would store), its
    amax, the scale and the codes. Plain PyTorch, on every device: the contract a fused kernel must meet.

    Args:
        x: (..., D) the residual stream, updated in place; h: the sublayer output, same shape and dtype.
        weight, bias: (D,) the LayerNorm's affine parameters; eps: its epsilon.

    Returns:
        :class:`Quantized` with (..., D) codes and a (..., 1) scale.
    """
    x.add_(h)
    stored = x.float()
    mean = stored.mean(dim=-1, keepdim=True)
    centered = stored - mean
    rstd = torch.rsqrt((centered * centered).mean(dim=-1, keepdim=True) + eps)
    normed = (centered * rstd * weight.float() + bias.float()).to(x.dtype)
    return quantize_rows(normed)


def quantize_rows_into(x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor) -> None:
    """:func:`quantize_rows` of ``x`` written into preallocated ``codes`` / ``scale`` (static buffers of a decode)."""
    quantized = quantize_rows(x)
    codes.copy_(quantized.codes)
    scale.copy_(quantized.scale)


def dequantize_into(codes: torch.Tensor, scale: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``codes * scale`` rounded to ``out``'s dtype, written into ``out`` (returned)."""
    return out.copy_(codes.float() * scale)
