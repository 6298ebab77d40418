"""``procap.fast.Captioner``: drop-in fast inference for a trained ProCap model.

What makes it fast on CUDA (each piece is skipped or a no-op on the CPU, where the same code runs):

- bf16 weights (fp16 where bf16 is unsupported), the VQGAN in channels-last with ``cudnn.benchmark``;
- the procedure encoder through the fastest ``procap.attention`` backend;
- the memory's cross-attention keys/values computed once per caption batch ("prefill");
- a static KV cache for decoder self-attention (fixed shapes, the position as a device tensor);
- the whole decoding step captured in a CUDA graph per batch bucket (the batch is padded up to the
  bucket) and replayed ``max_len - 1`` times with no host synchronisation; one copy out at the end.

The oracle is ``ProCap.generate``: in fp32 the tokens are equal.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from procap.attention import select_backend
from procap.errors import ProCapError
from procap.fast.decoding import DecodeState
from procap.fast.graphs import CapturedStep, GraphCache
from procap.fast.inputs import to_image_batch
from procap.fast.nvtx import annotate_module, nvtx_range

DEFAULT_BATCH_SIZES = (1, 8, 32, 128)


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def default_dtype(device: torch.device) -> torch.dtype:
    """bf16 on GPUs that support it, else fp16; fp32 on the CPU (exact equality with the oracle)."""
    if device.type != "cuda":
        return torch.float32
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16


def _parse_dtype(dtype: torch.dtype | str | None, device: torch.device) -> torch.dtype:
    if dtype is None:
        return default_dtype(device)
    if isinstance(dtype, torch.dtype):
        return dtype
    names = {
        "fp32": torch.float32,
        "float32": torch.float32,
        "bf16": torch.bfloat16,
        "bfloat16": torch.bfloat16,
        "fp16": torch.float16,
        "float16": torch.float16,
    }
    if dtype not in names:
        raise ProCapError(f"unknown dtype {dtype!r}; choose one of {', '.join(names)}")
    return names[dtype]


class Captioner:
    """Fast greedy change captioning.

    Args:
        model: a trained :class:`procap.model.procap.ProCap` (copied; the original is left as it is).
        vocab: the model's :class:`procap.data.Vocabulary`.
        device: where to run (default: CUDA when available, else CPU).
        dtype: compute dtype (default: bf16 on CUDA, fp32 on CPU); a string like ``"bf16"`` works too.
        max_len: caption length including BOS; ``max_len - 1`` tokens are decoded (no early exit).
            None means the model's ``config.max_caption_len``.
        batch_sizes: batch buckets; a batch is padded up to the smallest bucket that holds it (on CUDA) and
            split into chunks of the largest bucket when bigger.
        use_graphs: capture the decoding step in CUDA graphs (default: on CUDA only).
        pad_to_bucket: pad batches up to their bucket (default: when graphs are used; the CPU gains nothing).
        capture_memory: also run VQGAN + encoder + prefill from static input buffers, captured in one CUDA graph
            per bucket when ``use_graphs`` (cuts launch overhead at small batches; implies bucket padding, and
            the VQGAN / encoder NVTX ranges then appear once at capture, replays show as ``procap.memory``).
        attention_backend: ``procap.attention`` backend for encoder and decoder (default: fastest available).
        copy_model: deep-copy ``model`` before casting it (False for a model nobody else holds).

    Example:
        >>> captioner = Captioner.from_checkpoint("runs/clevr/best.safetensors")
        >>> captioner(["bef.png"], ["aft.png"])
        ['the small red cube has moved']
    """

    def __init__(
        self,
        model: torch.nn.Module,
        vocab: Any,
        device: torch.device | str | None = None,
        dtype: torch.dtype | str | None = None,
        max_len: int | None = 24,
        batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES,
        use_graphs: bool | None = None,
        pad_to_bucket: bool | None = None,
        attention_backend: str = "auto",
        copy_model: bool = True,
        capture_memory: bool = False,
    ) -> None:
        self.device = torch.device(device) if device is not None else default_device()
        self.dtype = _parse_dtype(dtype, self.device)
        config = model.config
        max_len = config.max_caption_len if max_len is None else max_len
        if not 2 <= max_len <= config.max_caption_len:
            raise ProCapError(f"max_len must be in [2, {config.max_caption_len}], got {max_len}")
        if not batch_sizes or min(batch_sizes) < 1:
            raise ProCapError(f"batch_sizes must be positive integers, got {tuple(batch_sizes)}")
        self.config, self.vocab, self.max_len = config, vocab, max_len
        self.batch_sizes = tuple(sorted({int(b) for b in batch_sizes}))
        self.capture_memory = capture_memory
        self._requested = (use_graphs, pad_to_bucket, attention_backend)
        self._configure()
        self.model = self._prepare(copy.deepcopy(model) if copy_model else model)
        self._states: dict[tuple[int, int], DecodeState] = {}
        self._inputs: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._graphs = GraphCache(self.device, self.dtype)

    @classmethod
    def from_checkpoint(
        cls,
        path: str | Path,
        device: torch.device | str | None = None,
        dtype: torch.dtype | str | None = None,
        max_len: int | None = 24,
        batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES,
        **kwargs: Any,
    ) -> Captioner:
        """Load a checkpoint written by :func:`procap.checkpoint.save_checkpoint` (no pickle) and wrap it."""
        from procap.checkpoint import load_checkpoint

        model, vocab, _ = load_checkpoint(path)
        return cls(
            model,
            vocab,
            device=device,
            dtype=dtype,
            max_len=max_len,
            batch_sizes=batch_sizes,
            copy_model=False,
            **kwargs,
        )

    # -- set-up -------------------------------------------------------------------------------------------------
    def _configure(self) -> None:
        """Resolve graphs / padding / attention backend for the current device and dtype."""
        use_graphs, pad_to_bucket, backend = self._requested
        self.use_graphs = self.device.type == "cuda" if use_graphs is None else use_graphs
        if self.use_graphs and self.device.type != "cuda":
            raise ProCapError("use_graphs=True needs a CUDA device; CUDA graphs do not exist on the CPU")
        self.pad_to_bucket = (self.use_graphs or self.capture_memory) if pad_to_bucket is None else pad_to_bucket
        if self.capture_memory and not self.pad_to_bucket:
            raise ProCapError("capture_memory=True needs pad_to_bucket (static input buffers have bucket shapes)")
        self.backend = backend if backend != "auto" else select_backend(self.device, self.dtype)

    def _prepare(self, model: torch.nn.Module) -> torch.nn.Module:
        model.eval().requires_grad_(False)
        model.to(device=self.device, dtype=self.dtype)
        for module in model.modules():
            if hasattr(module, "backend") and hasattr(module, "q_proj"):
                module.backend = self.backend
        if self.device.type == "cuda":
            # cuDNN picks its convolution algorithms for channels-last bf16 once per shape.
            torch.backends.cudnn.benchmark = True
            model.vqgan.to(memory_format=torch.channels_last)
        self._hooks = annotate_module(model.vqgan.encoder, "procap.vqgan", self.device)
        self._hooks += annotate_module(model.encoder, "procap.encoder", self.device)
        if self.device.type == "cuda":
            self._hooks.append(
                model.vqgan.encoder.register_forward_pre_hook(
                    lambda _m, args: (args[0].contiguous(memory_format=torch.channels_last), *args[1:])
                )
            )
        return model

    def to(self, device: torch.device | str | None = None, dtype: torch.dtype | str | None = None) -> Captioner:
        """Move to another device/dtype; cached decoding states and CUDA graphs are dropped."""
        self.device = torch.device(device) if device is not None else self.device
        self.dtype = _parse_dtype(dtype, self.device) if dtype is not None else self.dtype
        for hook in self._hooks:
            hook.remove()
        if self._requested[0] and self.device.type != "cuda":
            self._requested = (None, *self._requested[1:])  # graphs were asked for on CUDA; the CPU has none
        self._configure()
        self.model = self._prepare(self.model)
        self._states.clear()
        self._inputs.clear()
        self._graphs.retarget(self.device, self.dtype)
        return self

    # -- buckets, states and graphs -------------------------------------------------------------------------
    def bucket(self, batch: int) -> int:
        """Rows allocated for a chunk of ``batch`` rows (batch <= the largest bucket)."""
        if not self.pad_to_bucket:
            return batch
        return next(b for b in self.batch_sizes if b >= batch)

    def _state(self, bucket: int) -> DecodeState:
        key = (bucket, self.max_len)
        if key not in self._states:
            n = self.config.num_frames * self.config.tokens_per_frame
            self._states[key] = DecodeState(
                self.model.decoder, bucket, n, self.max_len, self.dtype, self.device, self.backend
            )
        return self._states[key]

    def _graph(self, state: DecodeState) -> CapturedStep:
        def build() -> CapturedStep:
            graph = CapturedStep(state.step, self.device, pool=self._graphs.pool)
            state.reset()  # warm-up steps advanced the state
            return graph

        return self._graphs.get((state.batch, self.max_len), build)

    def _static_inputs(self, bucket: int) -> tuple[torch.Tensor, torch.Tensor]:
        if bucket not in self._inputs:
            s = self.config.image_size
            self._inputs[bucket] = tuple(
                torch.zeros(bucket, 3, s, s, device=self.device, dtype=self.dtype) for _ in range(2)
            )
        return self._inputs[bucket]

    def _encode_step(self, state: DecodeState) -> Callable[[], None]:
        """VQGAN + encoder + prefill reading the bucket's static input buffers, as one replayable step."""
        before, after = self._static_inputs(state.batch)
        return lambda: state.prefill(self.model.memory(before, after))

    def _memory_graph(self, state: DecodeState) -> CapturedStep:
        def build() -> CapturedStep:
            graph = CapturedStep(self._encode_step(state), self.device, pool=self._graphs.pool)
            state.reset()
            return graph

        return self._graphs.get(("memory", state.batch, self.max_len), build)

    @property
    def graphs(self) -> GraphCache:
        """The captured graphs, keyed by (batch bucket, max_len)."""
        return self._graphs

    # -- captioning ---------------------------------------------------------------------------------------------
    @torch.no_grad()
    def memory(self, before: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
        """Decoder memory (B, N, dec_dim) of [0, 1] image batches (B, 3, S, S) (VQGAN + encoder + MLP)."""
        before = before.to(self.device, self.dtype, non_blocking=True)
        after = after.to(self.device, self.dtype, non_blocking=True)
        return self.model.memory(before, after)

    @torch.no_grad()
    def decode(self, memory: torch.Tensor) -> torch.Tensor:
        """Greedy tokens from a memory (b, N, D), b <= the largest bucket -> (b, max_len - 1) on the device."""
        b = memory.shape[0]
        state = self._state(self.bucket(b))
        graph = self._graph(state) if self.use_graphs else None
        with nvtx_range("procap.prefill", self.device):
            state.prefill(memory)
        with nvtx_range("procap.decode", self.device):
            for _ in range(state.steps):
                graph.replay() if graph is not None else state.step()
        return state.out[:b].clone()  # clone out: the next batch overwrites the static buffer

    @torch.no_grad()
    def _generate_static(self, before: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
        """``capture_memory`` path: copy in -> (replay) encode -> (replay) decode steps -> clone out."""
        b = before.shape[0]
        state = self._state(self.bucket(b))
        static_before, static_after = self._static_inputs(state.batch)
        static_before[:b].copy_(before, non_blocking=True)
        static_after[:b].copy_(after, non_blocking=True)
        encode = self._memory_graph(state).replay if self.use_graphs else self._encode_step(state)
        step = self._graph(state).replay if self.use_graphs else state.step
        with nvtx_range("procap.memory", self.device):
            encode()
        with nvtx_range("procap.decode", self.device):
            for _ in range(state.steps):
                step()
        return state.out[:b].clone()

    @torch.no_grad()
    def generate(self, before: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
        """Tokens for image batches (B, 3, S, S) in [0, 1] -> (B, max_len - 1) int64 on the device.

        Same contract as ``ProCap.generate``: EOS included, PAD after it, specials suppressed.
        """
        if before.shape != after.shape:
            raise ProCapError(
                f"before and after batches differ in shape: {tuple(before.shape)} vs {tuple(after.shape)}"
            )
        chunk, outs = self.batch_sizes[-1], []
        for start in range(0, before.shape[0], chunk):
            b, a = before[start : start + chunk], after[start : start + chunk]
            outs.append(self._generate_static(b, a) if self.capture_memory else self.decode(self.memory(b, a)))
        if not outs:
            return torch.empty(0, self.max_len - 1, dtype=torch.long, device=self.device)
        return torch.cat(outs)

    def images(self, images: Any) -> torch.Tensor:
        """Preprocess paths / PIL / numpy / tensors exactly like training: (B, 3, S, S) float in [0, 1]."""
        return to_image_batch(images, self.config.image_size)

    def __call__(self, befores: Any, afters: Any) -> list[str]:
        """Caption pairs: ``befores[i]`` -> ``afters[i]``. Returns one string per pair.

        Args:
            befores, afters: equally long sequences of paths, PIL images, numpy (H, W, 3) uint8 arrays or
                tensors, or (B, 3, S, S) float tensors in [0, 1].
        """
        before, after = self.images(befores), self.images(afters)
        if before.shape[0] != after.shape[0]:
            raise ProCapError(f"got {before.shape[0]} before images but {after.shape[0]} after images")
        tokens = self.generate(before, after).cpu().tolist()
        return [self.vocab.decode(row) for row in tokens]

    def caption(self, before: Any, after: Any) -> str:
        """Caption one pair (a path, PIL image, numpy array or tensor each)."""
        return self([before], [after])[0]
