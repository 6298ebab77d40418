"""NVTX ranges that show up in Nsight Systems and the torch profiler; no-ops off CUDA.

Ranges are pushed only when the work runs on a CUDA device, so the CPU path (and a CPU-only PyTorch
build, where ``torch.cuda.nvtx`` cannot load) pays nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def nvtx_range(name: str, device: torch.device | str | None = None) -> Iterator[None]:
    """Mark ``name`` in Nsight / profiler timelines while the block runs on ``device``.

    Args:
        name: the range label (``procap.vqgan``, ``procap.encoder``, ``procap.prefill``, ``procap.decode``).
        device: the device the work runs on; nothing is recorded unless it is a CUDA device.
    """
    on_cuda = device is not None and torch.device(device).type == "cuda"
    if on_cuda:
        torch.cuda.nvtx.range_push(name)
    # record_function makes the same label visible in torch.profiler traces on any device.
    with torch.profiler.record_function(name):
        try:
            yield
        finally:
            if on_cuda:
                torch.cuda.nvtx.range_pop()


def annotate_module(module: torch.nn.Module, name: str, device: torch.device | str) -> list:
    """Wrap every forward of ``module`` in :func:`nvtx_range` through hooks; returns the hook handles.

    Hooks keep the model's own code untouched: ``ProCap.memory`` runs as written and its VQGAN / encoder
    calls still appear as separate ranges.
    """
    state: list = []

    def pre_hook(_module, _args):
        ctx = nvtx_range(name, device)
        ctx.__enter__()
        state.append(ctx)

    def post_hook(_module, _args, _output):
        if state:
            state.pop().__exit__(None, None, None)

    return [module.register_forward_pre_hook(pre_hook), module.register_forward_hook(post_hook)]
