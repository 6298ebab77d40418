"""Scaled dot-product attention behind one function, used by the encoder and the decoder.

Backends (``BACKENDS``):

- ``flash``: the ``flash-attn`` package (CUDA, fp16/bf16, Ampere or newer; no arbitrary masks).
- ``xformers``: ``xformers.ops.memory_efficient_attention`` (CUDA).
- ``sdpa``: ``torch.nn.functional.scaled_dot_product_attention`` letting PyTorch pick its kernel;
  ``sdpa_flash``, ``sdpa_cudnn``, ``sdpa_efficient``, ``sdpa_math`` pin one kernel through
  ``torch.nn.attention.sdpa_kernel``.
- ``math``: the plain reference (softmax in fp32), the truth every other backend is tested against.

``auto`` resolves to the first available backend of :func:`auto_order` for the device's architecture and the
call's use (``USES``: ``encoder``, whole sequences; ``decode``, one query row against cached keys): the order a GPU
measured fastest (:data:`MEASURED_ORDER`, filled from ``bench/attention_backends.py``'s results, docs/gpu.md),
else :data:`SAFE_ORDER`, the backends that have run. The decision is made once per ``(architecture, dtype, use)``
and cached (like timm's ``fused_attn`` flag), and can be overridden for a
scope with :func:`use_backend` or for the process with the ``PROCAP_ATTENTION`` environment variable (checked
when read: an unknown or unavailable backend there is a :class:`~procap.core.errors.ProCapError` naming it).
Requesting an unavailable backend explicitly raises :class:`BackendUnavailableError` naming the backend and
how to install it.

Masks, broadcastable to (B, H, Lq, Lk), come in SDPA's two kinds: bool, True = may attend, or floating, an additive
bias on the scores (0 where a key is visible, -inf where it is not). The cached decoding step keeps its mask as such
a bias in a buffer that its pick opens one entry of per step, so no step builds a bool mask; every backend takes
either kind (flash-attn, and PyTorch's flash kernel on CUDA, neither). ``causal`` lets query i see keys ``j <= i + Lk - Lq`` (bottom-right aligned, so a
single decoding query sees the whole prefix).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib.util
import math
import os
import warnings
from collections.abc import Iterator

import torch
import torch.nn.functional as F

from procap.core.errors import ProCapError

SDPA_KERNELS = ("sdpa_flash", "sdpa_cudnn", "sdpa_efficient", "sdpa_math")
BACKENDS = ("auto", "flash", "xformers", "sdpa", *SDPA_KERNELS, "math")
_INSTALL_HINTS = {
    "flash": "pip install flash-attn --no-build-isolation (CUDA, fp16/bf16, compute capability >= 8.0)",
    "xformers": "pip install xformers (a wheel matching your torch and CUDA versions)",
    "sdpa_cudnn": "a CUDA build of PyTorch with cuDNN >= 9 on a Hopper/Ampere GPU",
    "sdpa_efficient": "a CUDA build of PyTorch",
    "sdpa_flash": "a CUDA build of PyTorch on compute capability >= 8.0 with fp16/bf16, or any CPU build",
}
# What ``auto`` chooses for: whole sequences (the encoder, every call with several queries), or one query row against
# cached keys (the decoding steps), whose best kernels differ.
USES = ("encoder", "decode")
# ``auto``'s order where no GPU measured one: PyTorch's own dispatcher, which every GPU run so far used, then the
# reference. flash-attn and xformers have never run here (the GPU image lacks them): they come first only once a
# measurement puts them there.
SAFE_ORDER = ("sdpa", "math")
# ``auto``'s order per (architecture, use), fastest first, measured by bench/attention_backends.py (bf16) and pasted
# from its ``--order-from`` output (docs/gpu.md, "Attention backend by measurement"). Architectures are
# ``device_architecture``'s names (``sm90``: H100 / H200). Empty until a GPU has run the bench.
MEASURED_ORDER: dict[tuple[str, str], tuple[str, ...]] = {}

_override: contextvars.ContextVar[str | None] = contextvars.ContextVar("procap_attention_backend", default=None)
_auto_cache: dict[tuple[str, torch.dtype, str], str] = {}
_probe_cache: dict[tuple[str, str, torch.dtype], str | None] = {}
_reason_cache: dict[tuple[str, str, torch.dtype], str | None] = {}


class BackendUnavailableError(ProCapError, RuntimeError):
    """An explicitly requested attention backend cannot run on this device/dtype/installation."""


class UnknownBackendError(ProCapError, ValueError):
    """A backend name outside ``BACKENDS`` (a ``ValueError`` as before, and a one-sentence user error)."""


# Forces every ``auto`` choice of the process, for runs that cannot pass an argument down.
BACKEND_ENV = "PROCAP_ATTENTION"


def attention_math(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, attn_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Reference attention, softmax in fp32.

    Args:
        q: (B, H, Lq, Dh); k, v: (B, H, Lk, Dh).
        causal: mask keys after the query position (query i sees keys <= i + Lk - Lq).
        attn_mask: optional mask broadcastable to (B, H, Lq, Lk): bool, True = may attend, or an additive float bias.

    Returns:
        (B, H, Lq, Dh) in q's dtype.
    """
    scores = (q.float() @ k.float().transpose(-2, -1)) / math.sqrt(q.shape[-1])
    if causal:
        scores = scores.masked_fill(~causal_mask(q.shape[-2], k.shape[-2], q.device), float("-inf"))
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        scores = scores.masked_fill(~attn_mask, float("-inf"))
    elif attn_mask is not None:  # a bias of 0 / -inf: adding 0 leaves a score's bits as they are
        scores = scores + attn_mask.float()
    return (scores.softmax(-1) @ v.float()).to(q.dtype)


def causal_mask(lq: int, lk: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Bottom-right aligned causal mask (Lq, Lk), True = may attend."""
    return torch.ones(lq, lk, dtype=torch.bool, device=device).tril(lk - lq)


def with_causal(attn_mask: torch.Tensor, lq: int, lk: int) -> torch.Tensor:
    """``attn_mask`` (bool or additive) that also hides the keys after each query (:func:`causal_mask`)."""
    causal = causal_mask(lq, lk, attn_mask.device)
    if attn_mask.dtype == torch.bool:
        return attn_mask & causal
    return attn_mask.masked_fill(~causal, float("-inf"))


# ----------------------------------------------------------------------------------------------- availability


def _import_reason(backend: str) -> str | None:
    module = {"flash": "flash_attn", "xformers": "xformers"}.get(backend)
    if module and importlib.util.find_spec(module) is None:
        return f"the {module} package is not installed"
    if backend == "flash":
        # flash-attn 4 installs only the namespace flash_attn.cute: find_spec("flash_attn") succeeds, but the
        # flash-attn 2 entry point this backend calls is missing, so ask for the function itself.
        try:
            from flash_attn import flash_attn_func  # noqa: F401
        except (ImportError, OSError) as exc:
            return f"flash_attn has no usable flash_attn_func (flash-attn 4 ships only flash_attn.cute): {exc}"
    return None


def _static_reason(backend: str, device_type: str, dtype: torch.dtype) -> str | None:
    """Why ``backend`` cannot run on (device type, dtype), judged without running it; None if it may."""
    if backend in ("math", "sdpa", "sdpa_math"):
        return None
    if backend in ("flash", "xformers", "sdpa_cudnn", "sdpa_efficient") and device_type != "cuda":
        return f"it needs a CUDA device, got {device_type}"
    reason = _import_reason(backend)  # after the device check: importing flash_attn loads its CUDA library
    if reason:
        return reason
    if backend == "flash":
        if dtype not in (torch.float16, torch.bfloat16):
            return f"flash-attn supports only fp16/bf16, got {dtype}"
        if torch.cuda.get_device_capability()[0] < 8:
            return "flash-attn 2 needs compute capability >= 8.0"
    return None


def _probe(backend: str, device_type: str, dtype: torch.dtype) -> str | None:
    """Run a tiny call once to learn whether a pinned SDPA kernel works here (rules vary by build)."""
    key = (backend, device_type, dtype)
    if key not in _probe_cache:
        q = torch.zeros(1, 1, 8, 64, device=device_type, dtype=dtype)
        try:
            with warnings.catch_warnings():  # PyTorch warns once per refused kernel; the reason is returned instead
                warnings.simplefilter("ignore")
                _run_backend(backend, q, q, q, False, None)
            _probe_cache[key] = None
        except RuntimeError as exc:  # PyTorch: "No viable backend ..." with per-kernel warnings
            _probe_cache[key] = f"PyTorch has no usable {backend[5:]} kernel here ({str(exc).splitlines()[0][:80]})"
    return _probe_cache[key]


def unavailable_reason(backend: str, device: torch.device | str, dtype: torch.dtype) -> str | None:
    """Why ``backend`` cannot run for this device and dtype, or None when it can.

    Args:
        backend: one of ``BACKENDS`` other than ``auto``.
        device: the device the tensors live on.
        dtype: the tensors' dtype.
    """
    if backend not in BACKENDS or backend == "auto":
        raise UnknownBackendError(f"unknown attention backend {backend!r}; choose one of {BACKENDS[1:]}")
    device = torch.device(device)
    key = (backend, str(device), dtype)
    if key not in _reason_cache:  # cached: explicit backends are checked on every call
        reason = _static_reason(backend, device.type, dtype)
        if reason is None and backend in SDPA_KERNELS:
            reason = _probe(backend, device.type, dtype)
        _reason_cache[key] = reason
    return _reason_cache[key]


def available_backends(device: torch.device | str, dtype: torch.dtype) -> list[str]:
    """Backends that can run on ``device`` with ``dtype`` (``auto`` excluded), in ``BACKENDS`` order."""
    return [b for b in BACKENDS[1:] if unavailable_reason(b, device, dtype) is None]


def device_architecture(device: torch.device | str) -> str:
    """The key of :data:`MEASURED_ORDER` for ``device``: ``sm<major><minor>`` for a CUDA GPU, else the device type
    (also ``cuda`` where no GPU can be asked: that key has no entry, so ``auto`` takes the safe order)."""
    device = torch.device(device)
    if device.type != "cuda":
        return device.type
    if not torch.cuda.is_available():  # a CUDA configuration resolved on a machine without one (configure_as)
        return "cuda"
    return _cuda_architecture(torch.cuda.current_device() if device.index is None else device.index)


@functools.cache
def _cuda_architecture(index: int) -> str:
    """Asked once per GPU: ``auto`` reads it on every call."""
    major, minor = torch.cuda.get_device_capability(index)
    return f"sm{major}{minor}"


def auto_order(architecture: str, use: str) -> tuple[str, ...]:
    """The backends ``auto`` tries, in order: the measured order of (``architecture``, ``use``), then the rest of
    :data:`SAFE_ORDER`; an architecture nothing was measured on gets :data:`SAFE_ORDER` alone."""
    if use not in USES:
        raise ValueError(f"unknown attention use {use!r}; choose one of {USES}")
    measured = MEASURED_ORDER.get((architecture, use), ())
    return (*measured, *(backend for backend in SAFE_ORDER if backend not in measured))


def select_backend(device: torch.device | str, dtype: torch.dtype, use: str = "encoder") -> str:
    """The backend ``auto`` resolves to for (device architecture, dtype, use): the first available one of
    :func:`auto_order`; decided once and cached.

    A scope opened with :func:`use_backend` or the ``PROCAP_ATTENTION`` environment variable wins.
    """
    forced = _override.get()
    if forced:
        return forced
    from_environment = os.environ.get(BACKEND_ENV) or None
    if from_environment and from_environment != "auto":
        _check_environment_backend(from_environment, device, dtype)
        return from_environment
    key = (device_architecture(device), dtype, use)
    if key not in _auto_cache:
        device_type = torch.device(device).type
        order = auto_order(key[0], use)
        _auto_cache[key] = next(b for b in order if unavailable_reason(b, device_type, dtype) is None)
    return _auto_cache[key]


def resolve_backend(backend: str, device: torch.device | str, dtype: torch.dtype, use: str = "encoder") -> str:
    """The backend a layer set to ``backend`` runs on: ``auto`` resolved for the device, dtype and use
    (:data:`USES`), any other as it is.

    What code fixing its backend ahead of the calls uses (the cached decoding step, whose state is set up once and
    replayed, with ``use="decode"``, and ``procap.fast``'s settings), so that they resolve ``auto`` as
    :func:`attention` would.
    """
    return select_backend(device, dtype, use) if backend == "auto" else backend


def _check_environment_backend(backend: str, device: torch.device | str, dtype: torch.dtype) -> None:
    """The backend ``PROCAP_ATTENTION`` names exists and runs here; otherwise one sentence naming the variable (a
    backend met later, deep in a forward pass, would name neither it nor the fix)."""
    if backend not in BACKENDS:
        raise UnknownBackendError(
            f"environment variable {BACKEND_ENV}={backend!r} is not an attention backend; choose one of "
            f"{', '.join(BACKENDS)} or unset it."
        )
    reason = unavailable_reason(backend, device, dtype)
    if reason is not None:
        raise BackendUnavailableError(
            f"environment variable {BACKEND_ENV}={backend} names a backend that is unavailable here because "
            f"{reason}; unset it or choose another."
        )


@contextlib.contextmanager
def use_backend(backend: str) -> Iterator[None]:
    """Make ``backend="auto"`` calls inside the ``with`` block use ``backend`` (checked on first use)."""
    if backend not in BACKENDS:
        raise UnknownBackendError(f"unknown attention backend {backend!r}; choose one of {BACKENDS}")
    token = _override.set(None if backend == "auto" else backend)
    try:
        yield
    finally:
        _override.reset(token)


def _require(backend: str, q: torch.Tensor) -> None:
    reason = unavailable_reason(backend, q.device, q.dtype)
    if reason is not None:
        hint = _INSTALL_HINTS.get(backend)
        raise BackendUnavailableError(
            f"attention backend {backend!r} is unavailable because {reason}" + (f"; it needs {hint}" if hint else "")
        )


# ----------------------------------------------------------------------------------------------- kernels


def _sdpa(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, attn_mask: torch.Tensor | None
) -> torch.Tensor:
    lq, lk = q.shape[-2], k.shape[-2]
    if causal and attn_mask is not None:
        # SDPA refuses is_causal together with a mask: fold the causal part into the mask.
        attn_mask, causal = with_causal(attn_mask, lq, lk), False
    if causal and lq != lk:
        # SDPA's is_causal is top-left aligned; ours is bottom-right.
        from torch.nn.attention.bias import causal_lower_right

        return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(lq, lk))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=causal)


def _flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    from flash_attn import flash_attn_func

    # flash-attn wants (B, L, H, Dh); its causal mask is bottom-right aligned (>= 2.1), like ours.
    out = flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=causal)
    return out.transpose(1, 2)


def _xformers(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, attn_mask: torch.Tensor | None
) -> torch.Tensor:
    from xformers import ops as xops

    bias = None
    if attn_mask is not None:
        if causal:
            attn_mask = with_causal(attn_mask, q.shape[-2], k.shape[-2])
        bias = _additive_bias(attn_mask, q)
    elif causal:
        bias = xops.fmha.attn_bias.LowerTriangularFromBottomRightMask()
    out = xops.memory_efficient_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_bias=bias)
    return out.transpose(1, 2)


def _additive_bias(attn_mask: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """A bool or additive mask as an additive bias (B, H, Lq, Lk) in q's dtype; xformers wants the last dim
    8-aligned in memory."""
    b, h, lq = q.shape[0], q.shape[1], q.shape[2]
    lk = attn_mask.shape[-1]
    padded = torch.empty(b, h, lq, (lk + 7) // 8 * 8, dtype=q.dtype, device=q.device)
    bias = padded[..., :lk]
    if attn_mask.dtype == torch.bool:
        attn_mask = torch.zeros((), dtype=q.dtype, device=q.device).masked_fill(~attn_mask, float("-inf"))
    bias.copy_(attn_mask.expand(b, h, lq, lk))
    return bias


def _run_backend(
    backend: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, attn_mask: torch.Tensor | None
) -> torch.Tensor:
    if backend == "math":
        return attention_math(q, k, v, causal, attn_mask)
    if backend == "sdpa":
        return _sdpa(q, k, v, causal, attn_mask)
    if backend in SDPA_KERNELS:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        kernel = {
            "sdpa_flash": SDPBackend.FLASH_ATTENTION,
            "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION,
            "sdpa_efficient": SDPBackend.EFFICIENT_ATTENTION,
            "sdpa_math": SDPBackend.MATH,
        }[backend]
        if backend == "sdpa_flash" and q.is_cuda and attn_mask is not None:
            # PyTorch's CUDA flash kernel has no mask input; asking for it with one fails with "No available kernel".
            raise BackendUnavailableError(
                "attention backend 'sdpa_flash' does not take attn_mask on CUDA; use 'sdpa' or 'auto'"
            )
        with sdpa_kernel([kernel]):
            return _sdpa(q, k, v, causal, attn_mask)
    if backend == "flash":
        if attn_mask is not None:
            raise BackendUnavailableError("attention backend 'flash' does not take attn_mask; use 'sdpa' or 'auto'")
        return _flash(q, k, v, causal)
    if backend == "xformers":
        return _xformers(q, k, v, causal, attn_mask)
    raise UnknownBackendError(f"unknown attention backend {backend!r}; choose one of {BACKENDS}")


def backend_for_mask(backend: str, attn_mask: torch.Tensor | None) -> str:
    """The backend a layer holding ``backend`` runs a call with ``attn_mask`` on: the one rule for masks.

    flash-attn takes no mask (the authors' encoder has one, and a KV-cached decoding step masks the cache slots not
    yet written): a masked call of a layer set to ``flash`` runs on ``sdpa``, whose PyTorch kernels take one.
    Every other backend, and every call without a mask, keeps ``backend``. An explicit ``backend="flash"`` given to
    :func:`attention` with a mask still raises: this fallback is for layers that hold a backend for all their calls.
    """
    return "sdpa" if attn_mask is not None and backend == "flash" else backend


def _flash_fits(q: torch.Tensor, attn_mask: torch.Tensor | None) -> bool:
    return attn_mask is None and q.shape[-1] <= 256 and q.shape[-1] % 8 == 0


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    attn_mask: torch.Tensor | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """Attention over (B, H, L, Dh) tensors with the chosen backend.

    Args:
        q: (B, H, Lq, Dh); k, v: (B, H, Lk, Dh), same dtype and device.
        causal: query i sees keys ``j <= i + Lk - Lq`` (bottom-right aligned).
        attn_mask: optional mask broadcastable to (B, H, Lq, Lk): bool, True = may attend, or an additive bias in a
            floating dtype (0 visible, -inf hidden), which SDPA takes as it is.
        backend: one of ``BACKENDS``; ``auto`` uses :func:`select_backend`, for the ``decode`` use when there is one
            query row (Lq = 1), else for ``encoder``.

    Returns:
        (B, H, Lq, Dh) in q's dtype.

    Raises:
        BackendUnavailableError: an explicitly named backend cannot run here.
    """
    if backend == "auto":
        backend = select_backend(q.device, q.dtype, "decode" if q.shape[-2] == 1 else "encoder")
        if backend == "flash" and not _flash_fits(q, attn_mask):
            backend = "sdpa"  # flash-attn takes no arbitrary mask / large head dims: PyTorch's kernels do
    if backend not in BACKENDS:
        raise UnknownBackendError(f"unknown attention backend {backend!r}; choose one of {BACKENDS}")
    if backend not in ("math", "sdpa"):
        _require(backend, q)
    return _run_backend(backend, q, k, v, causal, attn_mask)
