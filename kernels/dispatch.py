"""One small dispatch for every fused op: an op is named with its implementations, chosen once per input kind.

A :class:`FusedOp` names the plain PyTorch reference (the truth, runs anywhere), the Triton implementation
(CUDA tensors, or CPU tensors under ``TRITON_INTERPRET=1``), the compiled implementation (``torch.ops.procap.*``
from csrc/, compiled on first use by ``_ext``: C++ on CPU, CUDA where a GPU and nvcc are there) and the dtypes the
fused versions take. :func:`run` picks one:

* an explicit ``impl=`` ("reference", "triton", "cpp", "cuda") is checked and used, or raises ``ValueError``;
* otherwise the choice is made once per (op, device type, dtype, requires grad) and remembered: on CUDA the
  Triton kernel (the compiled CUDA op first only for ops registered with ``prefer_cuda_ext``), on CPU the compiled
  C++ op, else the reference, with one ``RuntimeWarning`` per op and device when falling back (none when the only
  reason is that the compiled ops could not be had: ``_ext`` says that once for all of them);
* ``PROCAP_KERNELS=reference`` forces the references everywhere; ``PROCAP_KERNELS=triton|cpp|cuda`` prefers that one
  where it can run (call :func:`reset_dispatch` after changing it).

This module also owns the optional Triton import (:data:`triton`, :data:`tl`, :func:`triton_jit`,
:func:`triton_constexpr` for module constants that kernels read): triton reads
``TRITON_INTERPRET`` when kernels are decorated, i.e. when ``procap.kernels`` is first imported.
"""

from __future__ import annotations

import functools
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from procap.kernels import _ext

try:
    import triton
    import triton.language as tl

    triton_jit = triton.jit
    # Module globals a kernel reads must be wrapped: compiled Triton refuses plain ints (the interpreter takes them).
    triton_constexpr = tl.constexpr
    INTERPRETED = bool(triton.knobs.runtime.interpret)
except ImportError:  # e.g. macOS/Windows wheels: the Triton implementations report themselves unavailable
    triton = tl = None
    INTERPRETED = False

    def triton_jit(fn: Callable) -> Callable:
        return fn

    def triton_constexpr(value: Any) -> Any:
        return value


_recording_launches = False  # set by procap.kernels.compile_check while it records (never runs) Triton launches


def set_recording_launches(on: bool) -> None:
    """While on, Triton launchers accept CPU tensors: ``compile_check`` records their launches for a GPU target."""
    global _recording_launches
    _recording_launches = on


def triton_can_take(tensor: torch.Tensor) -> bool:
    """Whether a Triton launcher may be handed ``tensor``: CUDA, the interpreter, or a compile check recording."""
    return tensor.device.type == "cuda" or INTERPRETED or _recording_launches


def require_triton_tensor(tensor: torch.Tensor, kernel: str) -> None:
    """Refuse ``tensor`` when :func:`triton_can_take` does, naming the ``kernel`` and how to run it on the CPU."""
    if not triton_can_take(tensor):
        raise ValueError(
            f"the Triton {kernel} needs CUDA tensors, got {tensor.device} (set TRITON_INTERPRET=1 before "
            "importing procap to run it on CPU)"
        )


IMPLS = ("reference", "triton", "cpp", "cuda")
NOT_LOADED = "the compiled ops are not loaded"
FUSED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class FusedOp:
    """One fused op and its implementations (all with the reference's arguments and outputs).

    Attributes:
        name: the dispatch name (``procap.kernels.<name>``).
        reference: the plain PyTorch implementation.
        triton: the Triton implementation.
        compiled: the implementation calling ``torch.ops.procap.<compiled_name>`` (CPU and CUDA), or None for an op
            without a csrc/ version (its reference is then the CPU implementation, chosen without a warning).
        compiled_name: the op whose per-device kernels decide whether ``cpp`` / ``cuda`` can run.
        dtypes: input dtypes the fused implementations take; others use the reference.
        prefer_cuda_ext: on CUDA try the compiled op before Triton (only once a GPU benchmark shows it ahead).
        differentiable: the fused implementations have a backward; a forward-only op (inference paths) runs its
            reference whenever an input requires grad.
    """

    name: str
    reference: Callable[..., Any]
    triton: Callable[..., Any]
    compiled: Callable[..., Any] | None = None
    compiled_name: str | None = None
    dtypes: tuple[torch.dtype, ...] = FUSED_DTYPES
    prefer_cuda_ext: bool = False
    differentiable: bool = True


_OPS: dict[str, FusedOp] = {}
_warned: set[tuple[str, str]] = set()


def register(op: FusedOp) -> FusedOp:
    """Make ``op`` known to :func:`run` and :func:`chosen_impl` under ``op.name``."""
    _OPS[op.name] = op
    return op


def why_not(op: FusedOp, impl: str, device_type: str, dtype: torch.dtype, requires_grad: bool = False) -> str | None:
    """None if ``impl`` can run ``op`` on such inputs, else the reason in a few words."""
    if impl == "reference":
        return None
    if requires_grad and not op.differentiable:
        return f"{op.name} has no fused backward (an input requires grad)"
    if dtype not in op.dtypes:
        return f"{dtype} is not one of the fused dtypes ({', '.join(str(d).replace('torch.', '') for d in op.dtypes)})"
    if impl == "triton":
        if triton is None:
            return "triton is not installed"
        if device_type != "cuda" and not INTERPRETED:
            return "Triton kernels need CUDA tensors (or TRITON_INTERPRET=1)"
        return None
    if op.compiled is None or op.compiled_name is None:
        return f"{op.name} has no compiled C++/CUDA version"
    want = "cpu" if impl == "cpp" else "cuda"
    if device_type != want:
        return f"impl={impl!r} runs on {want} tensors, got {device_type}"
    error = _ext.load_error()  # compiles the ops on their first use
    if error is not None:
        return f"{NOT_LOADED} ({error})"
    if not _ext.has_kernel(op.compiled_name, want):
        return f"the compiled ops have no {want} kernel for {op.name}"
    return None


def forced_impl() -> str:
    """``PROCAP_KERNELS`` in lower case, or ``""`` when unset.

    A value that names no implementation (``refrence``) is ignored with one ``RuntimeWarning`` naming the valid
    values, instead of silently running the automatic choice the user meant to override.
    """
    value = os.environ.get("PROCAP_KERNELS", "").strip().lower()
    if value and value not in IMPLS:
        if ("PROCAP_KERNELS", value) not in _warned:
            _warned.add(("PROCAP_KERNELS", value))
            warnings.warn(
                f"PROCAP_KERNELS={value!r} is not one of {', '.join(IMPLS)}; it is ignored and the automatic choice "
                "runs",
                RuntimeWarning,
                stacklevel=6,
            )
        return ""
    return value


def _preference(op: FusedOp, device_type: str) -> list[str]:
    forced = forced_impl()
    if forced == "reference":
        return ["reference"]
    if device_type == "cuda":
        order = ["cuda", "triton"] if op.prefer_cuda_ext else ["triton", "cuda"]
    elif device_type == "cpu":
        order = ["cpp"]
    else:
        order = []
    if op.compiled is None:  # Triton or the reference: nothing to fall back from on CPU
        order = [impl for impl in order if impl == "triton"]
    if forced in IMPLS and (forced in ("reference", "triton") or op.compiled is not None):
        order = [forced] + [impl for impl in order if impl != forced]
    return order + ["reference"]


@functools.cache
def _choose(name: str, device_type: str, dtype: torch.dtype, requires_grad: bool) -> str:
    """The implementation for this key; decided once (forgotten by :func:`reset_dispatch`)."""
    # A forward-only op (``differentiable=False``) falls back to its reference when an input requires grad.
    op = _OPS[name]
    reasons: list[str] = []
    for impl in _preference(op, device_type):
        reason = why_not(op, impl, device_type, dtype, requires_grad)
        if reason is None:
            if impl == "reference" and reasons and (name, device_type) not in _warned:
                _warned.add((name, device_type))
                warnings.warn(
                    f"procap.kernels.{name}: falling back to the PyTorch reference on {device_type} "
                    f"({'; '.join(reasons)})",
                    RuntimeWarning,
                    stacklevel=5,
                )
            return impl
        if not reason.startswith(NOT_LOADED):  # procap.kernels._ext has said why, once for every op
            reasons.append(f"{impl}: {reason}")
    raise AssertionError("unreachable: the reference always runs")


def resolve(name: str, impl: str | None, device: torch.device, dtype: torch.dtype, requires_grad: bool) -> str:
    """The implementation to run: ``impl`` after checking it can run here, or the remembered automatic choice."""
    if impl is None:
        return _choose(name, device.type, dtype, requires_grad)
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS} or None, got {impl!r}")
    reason = why_not(_OPS[name], impl, device.type, dtype, requires_grad)
    if reason is not None:
        raise ValueError(f"procap.kernels.{name}: impl={impl!r} cannot run here: {reason}")
    return impl


def run(name: str, impl: str | None, like: torch.Tensor, requires_grad: bool, *args: Any) -> Any:
    """Call op ``name`` with ``args`` through the implementation chosen for tensors like ``like``."""
    chosen = resolve(name, impl, like.device, like.dtype, requires_grad)
    return _implementation(_OPS[name], chosen)(*args)


def _implementation(op: FusedOp, impl: str) -> Callable[..., Any]:
    """The function of ``op`` that runs ``impl`` (one :func:`resolve` returned)."""
    if impl == "reference":
        return op.reference
    if impl == "triton":
        return op.triton
    if op.compiled is None:  # why_not refuses cpp / cuda for an op without a compiled version
        raise AssertionError(f"unreachable: {op.name} has no compiled version")
    return op.compiled


def chosen_impl(name: str, device: torch.device | str, dtype: torch.dtype, requires_grad: bool = False) -> str:
    """Which implementation the automatic choice uses for such inputs (for logs and benchmarks)."""
    if name not in _OPS:
        raise ValueError(f"unknown fused op {name!r}; known: {', '.join(sorted(_OPS))}")
    return _choose(name, torch.device(device).type, dtype, requires_grad)


def reset_dispatch() -> None:
    """Forget the remembered choices and warnings (after changing ``PROCAP_KERNELS``, in tests)."""
    _choose.cache_clear()
    _warned.clear()
