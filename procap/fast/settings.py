"""What a :class:`~procap.fast.Captioner` resolves from its arguments and its device, decided in one function.

Every choice that differs between the CPU and a GPU is made here, from the device *type* the defaults are taken
for (``configure_as``, by default the device's own), so the configuration a GPU resolves to can be built and run on
a CPU: only the CUDA-graph capture itself then differs (each graph's function runs eagerly in its place,
:class:`procap.fast.graphs.EagerStep`). CI runs the GPU's code paths this way.

FP8 (issue 52) is chosen here too: ``precision="fp8"`` (the procedure encoder's GEMMs in e4m3,
:mod:`procap.model.fp8_linear`) and ``kv_cache_dtype="fp8"`` (the decoder's cross-attention keys/values in e4m3)
resolve to the GEMM implementation that runs them: ``torch._scaled_mm`` on a CUDA GPU with FP8 tensor cores, the
fake-quant reference of :mod:`procap.kernels.fp8` on a CPU (also in the CUDA configuration, as the graphs run
eagerly there), and one sentence on a CUDA GPU without FP8 (compute capability below 8.9).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from procap.core.errors import ProCapError
from procap.kernels import fp8
from procap.kernels.attention import resolve_backend
from procap.model.decoding import DecodingStrategy, Greedy
from procap.model.fused_form import FusedChoice

DEVICE_TYPES = ("cpu", "cuda")  # the device types whose configuration the Captioner knows
GREEDY = Greedy()
PRECISIONS = ("bf16", "fp8")  # the encoder GEMMs' precision: the compute dtype's ("bf16", the default) or e4m3
KV_CACHE_DTYPES = {None: None, "fp8": fp8.E4M3, "e4m3": fp8.E4M3}  # the decoder's cross-attention keys/values


@dataclass(frozen=True)
class Settings:
    """A Captioner's resolved configuration.

    Attributes:
        configured_as: the device type whose defaults were taken (``"cuda"`` or ``"cpu"``).
        dtype: the compute dtype.
        use_graphs: one graph per bucket (the decoding step, or the whole pipeline with ``capture_memory``):
            captured on CUDA, run eagerly in its place elsewhere.
        pad_to_bucket: batches padded up to their bucket.
        capture_memory: the whole pipeline from static input buffers (one graph with ``use_graphs``).
        channels_last: the VQGAN (and its fused encoder) in channels-last layout.
        backend: what the attention backend resolves to on the device that runs.
        strategy: the :mod:`procap.model.decoding` strategy; one whose step is not ``captured_step`` (beam search,
            sampling) runs its cached form eagerly.
        precision: ``"bf16"`` (the encoder's GEMMs in the compute dtype) or ``"fp8"`` (in e4m3).
        fp8_gemm: the :data:`procap.kernels.fp8.GEMM_IMPLS` name the FP8 GEMMs run with (None without FP8).
        kv_cache_dtype: ``torch.float8_e4m3fn`` for the FP8 cross-attention cache, None for the compute dtype's.
    """

    configured_as: str
    dtype: torch.dtype
    use_graphs: bool
    pad_to_bucket: bool
    capture_memory: bool
    channels_last: bool
    backend: str
    strategy: DecodingStrategy
    precision: str = "bf16"
    fp8_gemm: str | None = None
    kv_cache_dtype: torch.dtype | None = None


def configured_type(device: torch.device, configure_as: str | None) -> str:
    """The device type whose defaults apply: ``configure_as`` when given, else the device's own."""
    if configure_as is None:
        return device.type
    if configure_as not in DEVICE_TYPES:
        raise ProCapError(f"configure_as must be one of {', '.join(DEVICE_TYPES)} or None, got {configure_as!r}.")
    return configure_as


def default_dtype(device: torch.device, configure_as: str | None = None) -> torch.dtype:
    """bf16 for a CUDA configuration (fp16 on a GPU without bf16), fp32 on the CPU (exact equality with the oracle)."""
    if configured_type(device, configure_as) != "cuda":
        return torch.float32
    if device.type == "cuda" and not torch.cuda.is_bf16_supported():
        return torch.float16
    return torch.bfloat16


def resolve_settings(
    device: torch.device,
    dtype: torch.dtype,
    *,
    configure_as: str | None = None,
    use_graphs: bool | None = None,
    pad_to_bucket: bool | None = None,
    capture_memory: bool | None = None,
    channels_last: bool | None = None,
    attention_backend: str = "auto",
    strategy: DecodingStrategy = GREEDY,
    precision: str = "bf16",
    kv_cache_dtype: str | torch.dtype | None = None,
) -> Settings:
    """Resolve the Captioner's options (None: the default of the configured device type).

    The rules: graphs, bucket padding, the whole pipeline from static buffers and channels-last are the CUDA
    configuration's defaults; a strategy other than greedy (beam search, sampling) decodes eagerly, so with it graphs
    and the static pipeline default to off and refuse to be turned on (never a greedy caption where beams or samples
    were asked for). Graphs on a device without CUDA graphs need ``configure_as="cuda"``, which says that their
    functions run eagerly.

    Args:
        device: where the Captioner runs.
        dtype: the compute dtype.
        the rest: as :class:`~procap.fast.Captioner` takes them.

    Raises:
        ProCapError: a combination that cannot run, in one sentence naming the arguments.
    """
    configured = configured_type(device, configure_as)
    use_graphs, pad_to_bucket, capture_memory = _capture_choices(
        device, configured, strategy, use_graphs, pad_to_bucket, capture_memory
    )
    backend = resolve_backend(attention_backend, device, dtype)
    cache_dtype = resolve_kv_cache_dtype(kv_cache_dtype)
    fp8_gemm = resolve_fp8_gemm(device, dtype, precision, fp8_wanted=cache_dtype is not None)
    return Settings(
        configured_as=configured,
        dtype=dtype,
        use_graphs=use_graphs,
        pad_to_bucket=pad_to_bucket,
        capture_memory=capture_memory,
        channels_last=configured == "cuda" if channels_last is None else bool(channels_last),
        backend=backend,
        strategy=strategy,
        precision=precision,
        fp8_gemm=fp8_gemm if precision == "fp8" else None,
        kv_cache_dtype=cache_dtype,
    )


def _capture_choices(
    device: torch.device,
    configured: str,
    strategy: DecodingStrategy,
    use_graphs: bool | None,
    pad_to_bucket: bool | None,
    capture_memory: bool | None,
) -> tuple[bool, bool, bool]:
    """``(use_graphs, pad_to_bucket, capture_memory)`` resolved by :func:`resolve_settings`'s rules."""
    eager = not strategy.captured_step
    if eager and (use_graphs or capture_memory):
        flag = "use_graphs" if use_graphs else "capture_memory"
        raise ProCapError(
            f"{flag}=True captures the greedy step; {strategy.name} decoding runs eagerly, so leave {flag} unset."
        )
    if use_graphs is None:
        use_graphs = configured == "cuda" and not eager
    if use_graphs and device.type != "cuda" and configured != "cuda":
        raise ProCapError(
            f"use_graphs=True needs a CUDA device (got {device}); configure_as='cuda' runs each graph's function "
            "eagerly in its place."
        )
    if capture_memory is None:  # the whole pipeline in one graph wherever graphs and bucket padding are on
        capture_memory = use_graphs and pad_to_bucket is not False
    if pad_to_bucket is None:
        pad_to_bucket = use_graphs or capture_memory
    if capture_memory and not pad_to_bucket:
        raise ProCapError("capture_memory=True needs pad_to_bucket (static input buffers have bucket shapes).")
    return bool(use_graphs), bool(pad_to_bucket), bool(capture_memory)


def resolve_kv_cache_dtype(kv_cache_dtype: str | torch.dtype | None) -> torch.dtype | None:
    """``kv_cache_dtype`` read: None (the compute dtype's cache) or ``torch.float8_e4m3fn`` ("fp8", "e4m3")."""
    if kv_cache_dtype == fp8.E4M3:
        return fp8.E4M3
    if isinstance(kv_cache_dtype, (str, type(None))) and kv_cache_dtype in KV_CACHE_DTYPES:
        return KV_CACHE_DTYPES[kv_cache_dtype]
    raise ProCapError(f"kv_cache_dtype must be None, 'fp8' or torch.float8_e4m3fn, got {kv_cache_dtype!r}.")


def resolve_fp8_gemm(device: torch.device, dtype: torch.dtype, precision: str, fp8_wanted: bool = False) -> str:
    """The FP8 GEMM implementation for ``device``: ``scaled_mm`` on an FP8 GPU, ``reference`` off CUDA.

    Args:
        precision: ``"bf16"`` or ``"fp8"``; fp8_wanted: the cross-attention cache asks for FP8 too.

    Raises:
        ProCapError: an unknown precision, FP8 on a CUDA GPU without it (compute capability below 8.9), or FP8 GEMMs
            on CUDA in a dtype other than bf16 (their row-wise form writes bf16).
    """
    if precision not in PRECISIONS:
        raise ProCapError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}.")
    if device.type != "cuda":
        return "reference"
    if precision == "fp8" or fp8_wanted:
        major, minor = torch.cuda.get_device_capability(device)
        if (major, minor) < fp8.MIN_CAPABILITY:
            raise ProCapError(
                f"FP8 needs a GPU with FP8 tensor cores (compute capability 8.9 or newer); {device} has {major}.{minor}."
            )
    if precision == "fp8" and dtype != torch.bfloat16:
        raise ProCapError(f"precision='fp8' on CUDA writes bf16 GEMM outputs; use dtype='bf16', not {dtype}.")
    return "scaled_mm"


def check_fp8_choices(
    precision: str, fused_encoder: object, fused_decoder: object, kv_cache_dtype: str | torch.dtype | None
) -> None:
    """Refuse, in one sentence, FP8 choices that cannot go together with the fused forms asked for.

    The encoder's GELU epilogues read ``fc1``'s bf16 weight, which the FP8 form no longer holds; the FP8 cross cache
    belongs to the decoder's fused step.
    """
    for epilogue in ("gelu_epilogue", "gelu_erf_epilogue"):
        if precision == "fp8" and isinstance(fused_encoder, Mapping) and fused_encoder.get(epilogue):
            raise ProCapError(f"precision='fp8' runs fc1 as an FP8 GEMM; leave fused_encoder's {epilogue} off.")
    if resolve_kv_cache_dtype(kv_cache_dtype) is not None and fused_decoder is False:
        raise ProCapError("kv_cache_dtype='fp8' is a cache of the fused decoding step; leave fused_decoder on.")


def fp8_decoder_choice(fused_decoder: FusedChoice, kv_cache_dtype: torch.dtype | None) -> FusedChoice:
    """The decoder's :meth:`~procap.model.procap.ProCap.use_fused` choice: the caller's (True, False or its options),
    with an FP8 cache its ``kv_cache_dtype`` option added (the readable decoder keeps no such cache)."""
    if kv_cache_dtype is None or fused_decoder is False:
        return fused_decoder
    options = {} if fused_decoder is True else dict(fused_decoder)
    return {**options, "kv_cache_dtype": kv_cache_dtype}
