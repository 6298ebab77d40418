"""``procap.fast.Captioner``: drop-in fast inference for a trained ProCap model.

What makes it fast on CUDA (each piece is skipped or a no-op on the CPU, where the same code runs):

- bf16 weights (fp16 where bf16 is unsupported), the VQGAN in channels-last (``cudnn_benchmark`` lets cuDNN pick
  its convolution algorithms while the Captioner runs);
- the fused inference form of every part, chosen with :meth:`procap.model.procap.ProCap.use_fused`: the VQGAN
  encoder's (bias-free convolutions, each bias added where its output is read; ``fused_vqgan``), the procedure
  encoder's (``fused_encoder``) and the decoder's cached step (``fused_decoder``);
- the procedure encoder and decoder through the attention backend given at construction;
- cached decoding: the memory's cross-attention keys/values once per batch, a static KV cache for
  self-attention, the position as a device tensor, through the model decoder's ``decode_step`` (for the paper's
  decoder the fused step of :mod:`procap.model.decoder_step`, about 30 ops);
- on CUDA one graph per batch bucket (the batch is padded up to the bucket) over the whole pipeline: pixel
  statistics, VQGAN, encoder, prefill and every decoding step (``capture_memory``, the default with graphs), or
  the decoding step alone replayed ``max_len - 1`` times; no host synchronisation inside; one copy out at the end,
  and one read of the pixel statistics after it.

Every choice that differs between the CPU and CUDA is resolved in one place (:mod:`procap.fast.settings`) from the
device type the defaults are taken for: ``configure_as="cuda"`` builds and runs the GPU's configuration on a CPU,
each graph's function run eagerly in place of its capture, which is how CI tests the GPU's code paths. Any other
:mod:`procap.model.decoding` strategy than greedy (beam search: ``num_beams > 1`` or ``strategy="beam"``; sampling:
``strategy="sample"``) always decodes by its rule: its eager cached form, on every device and configuration. Sampling
is not captured in a CUDA graph: a graph replaying a random draw needs its generator registered with the graph, so
that each replay moves the generator on, and the step runs eagerly as the beams' does.

Opt-in: ``torch_compile`` compiles the VQGAN encoder and the procedure encoder with ``torch.compile`` (Inductor
then fuses the VQGAN's GroupNorm + SiLU itself: ``procap.kernels.group_norm`` traces its reference under
compilation). The first call of each batch bucket compiles; benchmarks time it separately.

Everything kept per bucket (decoding state, static inputs, graphs) lives in one :class:`~procap.fast.bucket.Bucket`.
Process-wide switches (``cudnn.benchmark``, TF32) are options, set only while the Captioner runs and restored after.
The oracle is ``ProCap.generate``: in fp32 the tokens are equal.
"""

from __future__ import annotations

import contextlib
import copy
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from procap.core import validate
from procap.core.errors import OutOfDomainWarning, ProCapError, shown
from procap.core.hub_files import PretrainedSource
from procap.data.domain import domain_problem, pair_facts, read_domain
from procap.fast.bucket import Bucket
from procap.fast.inputs import as_float_pixels, pixel_stats, raise_for_pixel_stats, to_image_batch
from procap.fast.nvtx import annotate_module, nvtx_range
from procap.fast.settings import (
    Settings,
    check_fp8_choices,
    configured_type,
    default_dtype,
    fp8_decoder_choice,
    resolve_settings,
)
from procap.kernels.attention import BACKENDS
from procap.loading.checkpoint import check_can_caption, load_checkpoint
from procap.loading.hub import load_pretrained
from procap.model.decoding import DecodingStrategy, resolve_strategy
from procap.model.fp8_linear import quantize_encoder_linears
from procap.model.fused_form import fused_options

if TYPE_CHECKING:
    from procap.data import Vocabulary
    from procap.model.procap import ProCap

DEFAULT_BATCH_SIZES = (1, 8, 32, 128)
COMPUTE_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)  # float64: exact comparisons


def _raise_for_bad_pixels(stats: list) -> None:
    """Raise for the per-chunk ``[[before (finite, min, max)], [after ...]]`` statistics of a batch, read once."""
    for side, what in enumerate(("before images", "after images")):
        rows = [chunk[side] for chunk in stats]
        raise_for_pixel_stats((min(r[0] for r in rows), min(r[1] for r in rows), max(r[2] for r in rows)), what)


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _checked_device(device: torch.device | str | None) -> torch.device:
    """``device`` parsed and present on this machine (CUDA when available for None), else one sentence naming it."""
    return default_device() if device is None else validate.device(device, "device")


def _check_batch_sizes(batch_sizes: Any, config: Any, device: torch.device) -> None:
    """Positive integers, and none larger than the command line's ``--batch-size`` may be on ``device``
    (:func:`procap.train.batch_memory.check_batch`): on CUDA a batch is padded to its bucket, and the buffers of
    ``batch_sizes=[1, 10**8]`` were taken for two pairs."""
    if isinstance(batch_sizes, (str, bytes)) or not isinstance(batch_sizes, Sequence) or not batch_sizes:
        raise ProCapError(f"batch_sizes must be a sequence of positive integers, got {shown(batch_sizes)}")
    for size in batch_sizes:
        validate.integer(size, "each of batch_sizes", minimum=1)
    from procap.train.batch_memory import check_batch  # here: it imports the training modules

    check_batch(config, max(batch_sizes), "inference", device, flag="batch_sizes")


def _parse_dtype(dtype: torch.dtype | str | None, device: torch.device, configure_as: str | None) -> torch.dtype:
    if dtype is None:
        return default_dtype(device, configure_as)
    if isinstance(dtype, torch.dtype):
        if dtype not in COMPUTE_DTYPES:  # an integer model would caption garbage; float8 has no kernels
            raise ProCapError(
                f"dtype {dtype} cannot run the Captioner; choose one of "
                f"{', '.join(str(d).removeprefix('torch.') for d in COMPUTE_DTYPES)}."
            )
        return dtype
    names = {
        "fp32": torch.float32,
        "float32": torch.float32,
        "bf16": torch.bfloat16,
        "bfloat16": torch.bfloat16,
        "fp16": torch.float16,
        "float16": torch.float16,
    }
    if not isinstance(dtype, str) or dtype not in names:
        raise ProCapError(f"unknown dtype {dtype!r}; choose one of {', '.join(names)}")
    return names[dtype]


class Captioner:
    """Fast change captioning (greedy; beam search with ``num_beams``; any strategy of
    :data:`procap.model.decoding.STRATEGIES` by name).

    Args:
        model: a trained :class:`procap.model.procap.ProCap` (copied; the original is left as it is).
        vocab: the model's :class:`procap.data.Vocabulary`; None for a Captioner that only gives tokens
            (:meth:`generate`; benchmarks), whose :meth:`__call__` then refuses to write words.
        device: where to run (default: CUDA when available, else CPU).
        dtype: compute dtype (default: bf16 in the CUDA configuration, fp32 on CPU); a string like ``"bf16"`` works too.
        max_len: caption length including BOS; ``max_len - 1`` tokens are decoded (no early exit).
            None means the model's ``config.max_caption_len``.
        batch_sizes: batch buckets; a batch is padded up to the smallest bucket that holds it (on CUDA) and
            split into chunks of the largest bucket when bigger.
        use_graphs: capture the decoding step in CUDA graphs (default: in the CUDA configuration, greedy decoding).
            With ``configure_as="cuda"`` on a CPU each graph's function runs eagerly in place of its capture.
        pad_to_bucket: pad batches up to their bucket (default: when graphs are used; the CPU gains nothing).
        capture_memory: run the whole pipeline (pixel checks, VQGAN, encoder, prefill and every decoding step) from
            static input buffers, captured in one CUDA graph per bucket when ``use_graphs``; implies bucket
            padding. Default: on whenever graphs are used and batches are padded (every bucket, batch 32
            included). The VQGAN / encoder NVTX ranges then appear once at capture, replays as ``procap.pipeline``.
        channels_last: the VQGAN in channels-last layout (default: in the CUDA configuration).
        configure_as: the device type whose defaults are taken, ``"cuda"`` or ``"cpu"`` (default: the device's
            own). ``"cuda"`` on a CPU runs everything the GPU resolves to (bf16, bucket padding, static buffers, the
            whole pipeline as one function per bucket, lean decoding, the channels-last fused VQGAN, device-side
            pixel statistics) with only the graph capture replaced by running the same function eagerly.
            :attr:`settings` holds what was resolved.
        attention_backend: ``procap.kernels.attention`` backend for encoder and decoder, set on the model once here
            (``auto``: the fastest available for the device and dtype).
        copy_model: deep-copy ``model`` before casting it (False for a model nobody else holds).
        cudnn_benchmark: let cuDNN time its convolution algorithms (VQGAN) while the Captioner runs on CUDA;
            the process's setting is restored after every call.
        allow_tf32: TF32 matmuls/convolutions while the Captioner runs (None: leave the process's settings).
        torch_compile: compile the VQGAN encoder and the procedure encoder with ``torch.compile`` (never required):
            True, or a dict of ``torch.compile`` keyword arguments (e.g. ``{"mode": "max-autotune-no-cudagraphs"}``;
            ``dynamic`` defaults to False: one graph per bucket shape). The first call per bucket compiles.
        num_beams: the short form of beam search: 1 decodes greedily (CUDA graphs on GPU); more runs beam search
            on every device and in every configuration (:func:`procap.model.beam.beam_search_cached`: the beams of
            every pair are rows of one batch in the static KV cache, eager: graphs and ``capture_memory`` default
            to off and refuse to be turned on), equal to ``ProCap.generate(num_beams=...)`` in fp32.
        length_penalty: beam search ranks finished captions by log-probability / length ** length_penalty.
        strategy: a name of :data:`procap.model.decoding.STRATEGIES` (``"greedy"``, ``"beam"``, ``"sample"``) or a
            strategy object; greedy decoding is captured, any other strategy runs its cached form eagerly, equal to
            ``ProCap.generate`` with the same strategy in fp32 (sampling: the same ``seed`` on the same device).
        strategy_options: the named strategy's options (``{"top_p": 0.9, "seed": 1}``), checked here, once.
        fused_vqgan: run the VQGAN encoder in its fused form (:meth:`procap.model.vqgan.VQGAN.use_fused`:
            bias-free convolutions, biases added where their outputs are read, a 4x4 downsample, q/k/v in one
            GEMM, an 8-channel input): True, False (the readable encoder), or a dict of its options
            (e.g. ``{"downsample_4x4": False}``).
        fused_encoder: the procedure encoder's fused form (:meth:`procap.model.encoder.ProcedureEncoder.use_fused`):
            True (the default: each residual add + the LayerNorm after it in one kernel, the readable stack's
            values), False (the readable stack), or a dict of its options (e.g. ``{"gelu_epilogue": True}``: also
            the MLP's GELU in the GEMM epilogue, tanh-approximated on CUDA, so opt-in; ``{"gelu_erf_epilogue":
            True}``: the model's erf GELU in a Triton GEMM's epilogue, opt-in until a GPU has timed it).
        fused_decoder: the decoder's fused cached step (:meth:`procap.model.decoder.CaptionDecoder.use_fused`;
            True, the default), a dict of its options (``{"logits_pick": True}``: the greedy step's logits and
            pick in one Triton kernel; ``{"mlp": True}``: each layer's fc1 + GELU + fc2 in one Triton kernel; both
            opt-in) or False: every step the readable whole-prefix pass (slower; for comparison).
            The three go to :meth:`procap.model.procap.ProCap.use_fused` together.
        precision: ``"bf16"`` (the default: the procedure encoder's GEMMs in the compute dtype) or ``"fp8"``: its
            q/k/v/out, fc1 and fc2 GEMMs in e4m3 (weights quantised once here, per output channel; activations per
            row; :mod:`procap.model.fp8_linear`), ``torch._scaled_mm`` on a GPU of compute capability 8.9 or newer,
            the fake-quant reference on a CPU, refused on an older GPU. Check a model first with
            :func:`procap.fast.fp8_gate.fp8_captioner` (docs/gpu.md: what FP8 changes in the captions).
        kv_cache_dtype: None (the compute dtype) or ``"fp8"``: the decoder's cross-attention keys/values in e4m3
            (one scale per token and head; needs ``fused_decoder``).

    Out of domain: :attr:`domain` is the ``trained_on`` record of the model's weights (:mod:`procap.data.domain`,
    read from ``model.pretrained_info``; None when they record none). When a call's images are far from it (a 64 px
    synthetic model given 640 x 480 photographs) the Captioner warns once, with an
    :class:`~procap.core.errors.OutOfDomainWarning`, and captions them all the same; set ``domain = None`` to silence it.

    Example:
        >>> captioner = Captioner.from_checkpoint("runs/clevr/best.safetensors")
        >>> captioner(["bef.png"], ["aft.png"])
        ['the small red cube has moved']
    """

    def __init__(
        self,
        model: ProCap,
        vocab: Vocabulary | None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | str | None = None,
        max_len: int | None = None,
        batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES,
        use_graphs: bool | None = None,
        pad_to_bucket: bool | None = None,
        attention_backend: str = "auto",
        copy_model: bool = True,
        capture_memory: bool | None = None,
        cudnn_benchmark: bool = True,
        allow_tf32: bool | None = None,
        torch_compile: bool | dict[str, Any] = False,
        num_beams: int | None = None,
        length_penalty: float | None = None,
        strategy: str | DecodingStrategy | None = None,
        strategy_options: Mapping[str, Any] | None = None,
        fused_vqgan: bool | dict[str, Any] = True,
        fused_encoder: bool | dict[str, Any] = True,
        fused_decoder: bool | dict[str, Any] = True,
        channels_last: bool | None = None,
        configure_as: str | None = None,
        precision: str = "bf16",
        kv_cache_dtype: str | None = None,
    ) -> None:
        self.strategy = resolve_strategy(strategy, strategy_options, num_beams=num_beams, length_penalty=length_penalty)
        self.device = _checked_device(device)
        configured_type(self.device, configure_as)  # an unknown configure_as is refused before any work
        self.configure_as = configure_as
        self.dtype = _parse_dtype(dtype, self.device, configure_as)
        config = model.config
        ceiling = config.max_caption_len
        max_len = validate.caption_length(max_len, "max_len", ceiling=ceiling, default=ceiling)
        assert max_len is not None  # the default is the model's ceiling, an int: caption_length answers an int
        _check_batch_sizes(batch_sizes, config, self.device)
        self.config, self.vocab, self.max_len = config, vocab, max_len
        self.batch_sizes = tuple(sorted({int(b) for b in batch_sizes}))
        if attention_backend not in BACKENDS:
            raise ProCapError(f"unknown attention backend {attention_backend!r}; choose one of {', '.join(BACKENDS)}")
        self.cudnn_benchmark, self.allow_tf32 = cudnn_benchmark, allow_tf32
        self.attention_backend = attention_backend
        self.torch_compile = torch_compile
        for name, choice in (
            ("fused_vqgan", fused_vqgan),
            ("fused_encoder", fused_encoder),
            ("fused_decoder", fused_decoder),
        ):
            fused_options(choice, name)  # a choice of another type is refused before the model is copied
        check_fp8_choices(precision, fused_encoder, fused_decoder, kv_cache_dtype)
        self.fused_vqgan, self.fused_encoder, self.fused_decoder = fused_vqgan, fused_encoder, fused_decoder
        self._requested = (use_graphs, pad_to_bucket, capture_memory, channels_last)
        self.precision, self.kv_cache_dtype = precision, kv_cache_dtype
        self.fp8_gate: object | None = None  # the gate's measurement, when procap.fast.agreement.fp8_captioner built it
        # what the weights record they were trained on (``procap.data.domain``); None: unknown, never warned about
        self.domain = read_domain(getattr(model, "pretrained_info", None))
        self._domain_warned = False
        self.model = copy.deepcopy(model) if copy_model else model
        self._configure()
        self.model = self._prepare(self.model)
        self._buckets: dict[int, Bucket] = {}

    @classmethod
    def from_checkpoint(
        cls,
        path: str | Path,
        device: torch.device | str | None = None,
        dtype: torch.dtype | str | None = None,
        max_len: int | None = None,
        batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES,
        **kwargs: Any,
    ) -> Captioner:
        """Load a checkpoint written by :func:`procap.loading.checkpoint.save_checkpoint` (no pickle) and wrap it."""
        _checked_device(device)  # before the file is read
        model, vocab, metadata = load_checkpoint(path)
        check_can_caption(metadata, path)
        return cls._wrap_loaded(model, vocab, device, dtype, max_len, batch_sizes, **kwargs)

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str | Path,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | str | None = None,
        max_len: int | None = None,
        batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES,
        **kwargs: Any,
    ) -> Captioner:
        """A Captioner for a pretrained folder, a checkpoint file, ``hf://owner/repo[@rev]`` or ``owner/repo``
        (:func:`procap.loading.hub.load_pretrained`). Among ``kwargs``, those of
        :class:`~procap.core.hub_files.PretrainedSource` say where from (``revision``, ``cache_dir``,
        ``local_files_only`` or ``HF_HUB_OFFLINE=1`` to read the cache only, ``token`` for a private or gated repo,
        ``force_download`` to fetch again what the cache holds); the rest go to :class:`Captioner`."""
        source, kwargs = PretrainedSource.split(name_or_path, kwargs)
        _checked_device(device)  # before anything is read or downloaded
        model, vocab, metadata = load_pretrained(source)
        check_can_caption(metadata, name_or_path)
        return cls._wrap_loaded(model, vocab, device, dtype, max_len, batch_sizes, **kwargs)

    @classmethod
    def _wrap_loaded(
        cls,
        model: ProCap,
        vocab: Vocabulary,
        device: torch.device | str | None,
        dtype: torch.dtype | str | None,
        max_len: int | None,
        batch_sizes: Sequence[int],
        **kwargs: Any,
    ) -> Captioner:
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
        """Resolve every device-dependent choice (:func:`procap.fast.settings.resolve_settings`) into :attr:`settings`."""
        use_graphs, pad_to_bucket, capture_memory, channels_last = self._requested
        self.settings: Settings = resolve_settings(
            self.device,
            self.dtype,
            configure_as=self.configure_as,
            use_graphs=use_graphs,
            pad_to_bucket=pad_to_bucket,
            capture_memory=capture_memory,
            channels_last=channels_last,
            attention_backend=self.attention_backend,
            strategy=self.strategy,
            precision=self.precision,
            kv_cache_dtype=self.kv_cache_dtype,
        )
        self.use_graphs, self.pad_to_bucket = self.settings.use_graphs, self.settings.pad_to_bucket
        self.capture_memory = self.settings.capture_memory
        # What ``auto`` resolves to here (for logs and benchmarks); the model keeps the requested name.
        self.backend = self.settings.backend
        captures = self.use_graphs and self.device.type == "cuda"
        self._graph_pool = torch.cuda.graph_pool_handle() if captures else None

    def _prepare(self, model: ProCap) -> ProCap:
        model.eval().requires_grad_(False)
        model.use_fused(False)  # the fused VQGAN's derived buffers are made again after the move, below
        if self.settings.fp8_gemm is not None:  # quantised from the weights as loaded, before the cast
            quantize_encoder_linears(model.encoder, self.settings.fp8_gemm)
        model.to(device=self.device, dtype=self.dtype)
        model.set_attention_backend(self.attention_backend)
        channels_last = self.settings.channels_last
        if channels_last:
            # Module.to takes memory_format (torch._C._nn._parse_to reads it), but torch's overloads of it omit it
            model.vqgan.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
        vqgan = fused_options(self.fused_vqgan, "fused_vqgan")  # the layout is the settings' unless given
        fused_vqgan = vqgan is not None
        model.use_fused(
            vqgan=vqgan is not None and {"channels_last": channels_last, **vqgan},
            encoder=self.fused_encoder,
            decoder=fp8_decoder_choice(self.fused_decoder, self.settings.kv_cache_dtype),
        )
        self._hooks = annotate_module(model.vqgan.encoder, "procap.vqgan", self.device)
        self._hooks += annotate_module(model.encoder, "procap.encoder", self.device)
        if channels_last and not fused_vqgan:  # the fused encoder lays its input out itself
            self._hooks.append(
                model.vqgan.encoder.register_forward_pre_hook(
                    lambda _m, args: (args[0].contiguous(memory_format=torch.channels_last), *args[1:])
                )
            )
        if self.torch_compile:
            options = {"dynamic": False, **({} if self.torch_compile is True else dict(self.torch_compile))}
            for module in (model.vqgan.encoder, model.encoder):
                module.compile(**options)  # in place: state-dict keys and hooks stay as they are
        return model

    @contextlib.contextmanager
    def _process_flags(self) -> Iterator[None]:
        """Apply ``cudnn_benchmark`` / ``allow_tf32`` for the duration of a call and restore the previous values."""
        if self.device.type != "cuda":
            yield
            return
        cudnn, matmul = torch.backends.cudnn, torch.backends.cuda.matmul
        saved = (cudnn.benchmark, cudnn.allow_tf32, matmul.allow_tf32)
        cudnn.benchmark = self.cudnn_benchmark
        if self.allow_tf32 is not None:
            cudnn.allow_tf32 = matmul.allow_tf32 = self.allow_tf32
        try:
            yield
        finally:
            cudnn.benchmark, cudnn.allow_tf32, matmul.allow_tf32 = saved

    def to(self, device: torch.device | str | None = None, dtype: torch.dtype | str | None = None) -> Captioner:
        """Move to another device/dtype; the per-bucket states and CUDA graphs are dropped."""
        # Both checked before either is set: a refused argument leaves the Captioner as it was.
        new_device = _checked_device(device) if device is not None else self.device
        new_dtype = _parse_dtype(dtype, new_device, self.configure_as) if dtype is not None else self.dtype
        self.device, self.dtype = new_device, new_dtype
        for hook in self._hooks:
            hook.remove()
        if self._requested[0] and self.device.type != "cuda" and self.configure_as != "cuda":
            self._requested = (None, *self._requested[1:])  # graphs were asked for on CUDA; the CPU has none
        self._buckets.clear()  # captured graphs hold pointers to the old buffers
        self._configure()
        self.model = self._prepare(self.model)
        return self

    # -- buckets ----------------------------------------------------------------------------------------------------
    def bucket(self, batch: int) -> int:
        """Rows allocated for a chunk of ``batch`` rows (batch <= the largest bucket)."""
        if not self.pad_to_bucket:
            return batch
        return next(b for b in self.batch_sizes if b >= batch)

    def _bucket(self, batch: int) -> Bucket:
        rows = self.bucket(batch)
        if rows not in self._buckets:
            self._buckets[rows] = Bucket(self.model, rows, self.max_len, self.dtype, self.device, self._graph_pool)
        return self._buckets[rows]

    @property
    def graphs(self) -> frozenset[tuple]:
        """Keys of the captured graphs: ``(bucket, max_len)`` per decoding step, ``("pipeline", bucket, max_len)``."""
        return frozenset(key for bucket in self._buckets.values() for key in bucket.graph_keys())

    # -- captioning ---------------------------------------------------------------------------------------------
    @torch.no_grad()
    def memory(self, before: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
        """Decoder memory (B, N, dec_dim) of [0, 1] image batches (B, 3, S, S) (VQGAN + encoder + MLP)."""
        before = before.to(self.device, self.dtype, non_blocking=True)
        after = after.to(self.device, self.dtype, non_blocking=True)
        with self._process_flags():
            return self.model.memory(before, after)

    @torch.no_grad()
    def decode(self, memory: torch.Tensor) -> torch.Tensor:
        """Tokens from a memory (b, N, D), b <= the largest bucket -> (b, max_len - 1) on the device."""
        if not self.strategy.captured_step:
            with self._process_flags(), nvtx_range(f"procap.{self.strategy.name}", self.device):
                return self.strategy.cached(self.model.decoder, memory, self.max_len)
        b = memory.shape[0]
        bucket = self._bucket(b)
        step = bucket.step_replay() if self.use_graphs else bucket.step
        with self._process_flags():
            with nvtx_range("procap.prefill", self.device):
                bucket.prefill(memory)
            with nvtx_range("procap.decode", self.device):
                for _ in range(bucket.decoding.steps):
                    step()
        return bucket.decoding.out[:b].clone()  # clone out: the next batch overwrites the static buffer

    @torch.no_grad()
    def _generate_static(self, before: torch.Tensor, after: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``capture_memory`` path: copy in -> (replay) the whole pipeline -> clone out tokens and pixel statistics."""
        b = before.shape[0]
        bucket = self._bucket(b)
        static_before, static_after = bucket.static_inputs()
        static_before[:b].copy_(before, non_blocking=True)
        static_after[:b].copy_(after, non_blocking=True)
        if b < bucket.rows:  # padding rows: valid pixels, never a former batch's (the checks read every row)
            static_before[b:].zero_()
            static_after[b:].zero_()
        with self._process_flags():
            if self.use_graphs:
                with nvtx_range("procap.pipeline", self.device):
                    bucket.pipeline_replay()()
            else:
                with nvtx_range("procap.memory", self.device):
                    bucket.encode()
                with nvtx_range("procap.decode", self.device):
                    for _ in range(bucket.decoding.steps):
                        bucket.step()
        return bucket.decoding.out[:b].clone(), bucket.pixel_stats.clone()

    def _generate_eager(self, before: torch.Tensor, after: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Memory, then the (graphed) decoding loop; the pixel statistics computed on the device alongside."""
        before, after = before.to(self.device, non_blocking=True), after.to(self.device, non_blocking=True)
        stats = torch.stack([pixel_stats(before), pixel_stats(after)])
        return self.decode(self.memory(before, after)), stats

    @torch.no_grad()
    def generate(self, before: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
        """Tokens for image batches (B, 3, S, S) -> (B, max_len - 1) int64 on the device.

        Same contract as ``ProCap.generate``: EOS included, PAD after it, specials suppressed (the ``authors``
        variant: every step kept, only [UNK] suppressed). Pixels follow :mod:`procap.fast.inputs`' rule: uint8
        0-255 is scaled to [0, 1]; non-finite or out-of-range floats raise :class:`ProCapError`: their statistics
        are computed on the device with the work (inside the whole-pipeline graph) and read once, after everything
        is queued, so the check never stalls the GPU before the work.
        """
        if before.shape != after.shape:
            raise ProCapError(
                f"before and after batches differ in shape: {tuple(before.shape)} vs {tuple(after.shape)}"
            )
        before = as_float_pixels(before, "before images")
        after = as_float_pixels(after, "after images")
        chunk, outs, stats = self.batch_sizes[-1], [], []
        for start in range(0, before.shape[0], chunk):
            b, a = before[start : start + chunk], after[start : start + chunk]
            tokens, chunk_stats = self._generate_static(b, a) if self.capture_memory else self._generate_eager(b, a)
            outs.append(tokens)
            stats.append(chunk_stats)
        if stats:
            _raise_for_bad_pixels(torch.stack(stats).tolist())
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
        self._require_vocab()
        self.check_domain(befores, afters, stacklevel=3)
        return self._caption(befores, afters)

    def _caption(self, befores: Any, afters: Any) -> list[str]:
        before, after = self.images(befores), self.images(afters)
        if before.shape[0] != after.shape[0]:
            raise ProCapError(f"got {before.shape[0]} before images but {after.shape[0]} after images")
        vocab = self._require_vocab()
        tokens = self.generate(before, after).cpu().tolist()
        return [self.model.caption_text(vocab, row) for row in tokens]

    def check_domain(self, befores: Any, afters: Any, stacklevel: int = 2) -> None:
        """Warn once (:class:`~procap.core.errors.OutOfDomainWarning`) when pairs are far from the training domain,
        naming them (the first few and how many more).

        The rule is :func:`procap.data.domain.domain_problem`: sizes before the resize, and a camera's EXIF given to a
        synthetic-scene model. Paths are read for their header only; after one warning nothing more is read. Every
        call of the Captioner checks its own pairs; ``procap caption`` calls this once with all of its pairs, so
        that the warning counts them all rather than one batch's.

        Args:
            befores, afters: what :meth:`__call__` takes.
            stacklevel: as :func:`warnings.warn`'s; the default points at the line that called this method.
        """
        if self._domain_warned or self.domain is None:
            return
        problem = domain_problem(self.domain, pair_facts(befores, afters))
        if problem is not None:
            self._domain_warned = True
            warnings.warn(problem, OutOfDomainWarning, stacklevel=stacklevel)

    def _require_vocab(self) -> Vocabulary:
        """The vocabulary, which only captioning into words needs (``generate`` does not)."""
        if self.vocab is None:
            raise ProCapError("this Captioner was built without a vocabulary: give one to get words, or call generate")
        return self.vocab

    def caption(self, before: Any, after: Any) -> str:
        """Caption one pair (a path, PIL image, numpy array or tensor each)."""
        self._require_vocab()
        self.check_domain([before], [after], stacklevel=3)
        return self._caption([before], [after])[0]
