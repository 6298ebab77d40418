"""CUDA-graph capture of a step function that reads and writes only static buffers.

The recipe follows flash-attention's ``capture_graph``: run the step a few times on a side stream (so lazy
initialisation, cuBLAS workspaces and autotuning happen outside the graph), capture one call into a memory
pool shared by all graphs of a Captioner, then ``replay()`` it. Inputs are copied into the static buffers
before replaying and outputs cloned out afterwards by the caller.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


class CapturedStep:
    """One CUDA graph of ``step()``.

    Args:
        step: a function of no arguments whose inputs and outputs all live in tensors allocated before
            capture (its closure); it must not synchronise with the host.
        device: the CUDA device.
        pool: a memory pool handle shared with other graphs (``torch.cuda.graph_pool_handle()``).
        warmup: eager calls on a side stream before capture. They mutate the static state; callers reset it.
    """

    def __init__(self, step: Callable[[], None], device: torch.device, pool=None, warmup: int = 2) -> None:
        self.device = device
        side = torch.cuda.Stream(device=device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(warmup):
                step()
        torch.cuda.current_stream(device).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            step()

    def replay(self) -> None:
        """Launch the captured kernels on the current stream; returns without waiting for them."""
        self.graph.replay()


class EagerStep:
    """Where CUDA graphs do not exist: :class:`CapturedStep`'s warm-up calls, then ``replay()`` runs ``step()``.

    The stand-in that lets the graphed code path (static buffers, one function per bucket, the state reset after
    the warm-up) run on a CPU, where CI tests it; only the capture itself is left to the GPU.
    """

    def __init__(self, step: Callable[[], None], warmup: int = 2) -> None:
        for _ in range(warmup):  # mutate the static state as the capture's warm-up does: callers must reset it
            step()
        self.step = step

    def replay(self) -> None:
        self.step()
