"""What a :class:`~procap.fast.Captioner` resolves from its arguments and its device, decided in one function.

Every choice that differs between the CPU and a GPU is made here, from the device *type* the defaults are taken
for (``configure_as``, by default the device's own), so the configuration a GPU resolves to can be built and run on
a CPU: only the CUDA-graph capture itself then differs (each graph's function runs eagerly in its place,
:class:`procap.fast.graphs.EagerStep`). CI runs the GPU's code paths this way.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from procap.core.errors import ProCapError
from procap.kernels.attention import resolve_backend
from procap.model.decoding import DecodingStrategy, Greedy

DEVICE_TYPES = ("cpu", "cuda")  # the device types whose configuration the Captioner knows
GREEDY = Greedy()


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
    """

    configured_as: str
    dtype: torch.dtype
    use_graphs: bool
    pad_to_bucket: bool
    capture_memory: bool
    channels_last: bool
    backend: str
    strategy: DecodingStrategy


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
    backend = resolve_backend(attention_backend, device, dtype)
    return Settings(
        configured_as=configured,
        dtype=dtype,
        use_graphs=bool(use_graphs),
        pad_to_bucket=bool(pad_to_bucket),
        capture_memory=bool(capture_memory),
        channels_last=configured == "cuda" if channels_last is None else bool(channels_last),
        backend=backend,
        strategy=strategy,
    )
