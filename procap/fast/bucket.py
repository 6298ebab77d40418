"""Everything ``procap.fast.Captioner`` keeps for one batch bucket, in one object.

A bucket owns the decoding state (KV caches, tokens, position, finished flags, output), the static image buffers
of the ``capture_memory`` path with their pixel statistics, and the CUDA graphs captured over them: the decoding
step alone, or the whole pipeline (pixel checks, VQGAN, encoder, prefill and every decoding step) as one graph.
All of it is sized for ``rows`` and dropped together when the Captioner changes device or dtype.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from procap.fast.graphs import CapturedStep, EagerStep
from procap.fast.inputs import pixel_stats
from procap.model.decoder import CachedDecoder
from procap.model.procap import ProCap


class Bucket:
    """Static decoding state, input buffers and graphs for batches of up to ``rows`` pairs.

    Args:
        model: the Captioner's (cast, eval-mode) ProCap.
        rows: batch rows B of every buffer (real rows first, padding rows after).
        max_len: caption length including BOS.
        dtype, device: where the buffers live (the model's placement).
        graph_pool: the Captioner's CUDA memory pool shared by every captured graph (None off CUDA, where each
            "graph" is its function run eagerly: :class:`~procap.fast.graphs.EagerStep`).

    Attributes:
        decoding: the decoder's cached-decoding buffers.
        before, after: (B, 3, S, S) static image buffers, allocated on first use by :meth:`static_inputs`.
        pixel_stats: (2, 3) fp32 ``(all finite, min, max)`` of the before / after buffers, written by :meth:`encode`.
    """

    def __init__(
        self,
        model: ProCap,
        rows: int,
        max_len: int,
        dtype: torch.dtype,
        device: torch.device,
        graph_pool,
    ) -> None:
        self.model, self.rows, self.max_len = model, rows, max_len
        self.dtype, self.device, self.graph_pool = dtype, device, graph_pool
        # the decoders' common interface: the paper's (readable or fused state) and the authors' decode alike
        self.decoder: CachedDecoder = model.decoder
        self.decoding = self.decoder.setup_caches(rows, max_len, dtype, device)
        self.before: torch.Tensor | None = None
        self.after: torch.Tensor | None = None
        self.pixel_stats = torch.zeros(2, 3, device=device)
        self.step_graph: CapturedStep | EagerStep | None = None
        self.pipeline_graph: CapturedStep | EagerStep | None = None

    # -- eager steps (what the graphs capture) ---------------------------------------------------------------------
    def prefill(self, memory: torch.Tensor) -> None:
        """Cross-attention keys/values of a memory (b, N, D), b <= rows, and a fresh decoding state."""
        self.decoder.prefill(memory, self.decoding)

    def step(self) -> None:
        """One cached decoding step of the model decoder."""
        self.decoder.decode_step(self.decoding)

    def encode(self) -> None:
        """Pixel checks, VQGAN + encoder + prefill from the static image buffers (the ``capture_memory`` path).

        The pixel statistics go to :attr:`pixel_stats` on the device; the caller reads them with the output.
        """
        before, after = self.static_inputs()
        self.pixel_stats.copy_(torch.stack([pixel_stats(before), pixel_stats(after)]))
        self.prefill(self.model.memory(before, after))

    def pipeline(self) -> None:
        """:meth:`encode`, then every decoding step: one caption batch from the static buffers."""
        self.encode()
        for _ in range(self.decoding.steps):
            self.step()

    def static_inputs(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The (rows, 3, S, S) before/after buffers that ``encode`` reads."""
        if self.before is None or self.after is None:
            s = self.model.config.image_size
            self.before, self.after = (
                torch.zeros(self.rows, 3, s, s, device=self.device, dtype=self.dtype) for _ in range(2)
            )
        return self.before, self.after

    # -- graphs ----------------------------------------------------------------------------------------------------
    def _capture(self, fn: Callable[[], None]) -> CapturedStep | EagerStep:
        """A CUDA graph of ``fn`` on CUDA; elsewhere ``fn`` itself behind the same interface (the CPU has no graphs)."""
        graph: CapturedStep | EagerStep
        if self.device.type == "cuda":
            graph = CapturedStep(fn, self.device, pool=self.graph_pool)
        else:
            graph = EagerStep(fn)
        self.decoding.reset()  # the warm-up calls advanced the state
        return graph

    def step_replay(self) -> Callable[[], None]:
        """``replay`` of the decoding step's graph, captured on first use."""
        if self.step_graph is None:
            self.step_graph = self._capture(self.step)
        return self.step_graph.replay

    def pipeline_replay(self) -> Callable[[], None]:
        """``replay`` of the whole pipeline's graph (:meth:`pipeline`), captured on first use."""
        if self.pipeline_graph is None:
            self.pipeline_graph = self._capture(self.pipeline)
        return self.pipeline_graph.replay

    def graph_keys(self) -> list[tuple]:
        """``(rows, max_len)`` when the step is captured, ``("pipeline", rows, max_len)`` when everything is."""
        keys: list[tuple] = []
        if self.step_graph is not None:
            keys.append((self.rows, self.max_len))
        if self.pipeline_graph is not None:
            keys.append(("pipeline", self.rows, self.max_len))
        return keys
