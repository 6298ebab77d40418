"""How many programs of a compiled Triton kernel one GPU holds at once: the grid of a persistent kernel.

A persistent kernel launches as many programs as stay resident together and lets each take work items in turn; a
larger grid runs in waves (the last one partly empty), a smaller one leaves SMs idle. What stays resident follows
from the compiled kernel: its registers per thread (allocated per warp, in units of 256), its warps and its shared
memory, against what one SM has (:class:`SMLimits`). :func:`resident_ctas` is that arithmetic, a pure function;
:func:`resident_programs` asks Triton for the kernel it will launch (``warmup`` compiles it, or finds it compiled,
without running it) and multiplies by the SM count. Where no compiled kernel exists (the interpreter, the compile
check's recording, a CPU tensor) the caller's fallback stands in, so the same code path runs everywhere.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

logger = logging.getLogger(__name__)

SM_COUNT_OFF_CUDA = 132  # an H100's: off CUDA (the interpreter, the compile check) grids are sized as on that GPU


@dataclass(frozen=True)
class SMLimits:
    """What one streaming multiprocessor holds at once. The defaults are sm_90's (H100, H200)."""

    registers: int = 65536
    threads: int = 2048
    shared_bytes: int = 228 * 1024
    ctas: int = 32
    register_unit: int = 256  # registers are allocated per warp, in units of this many
    shared_reserved: int = 1024  # shared memory the driver keeps per CTA (sm_80 and later)


HOPPER = SMLimits()


def resident_ctas(registers: int, num_warps: int, shared_bytes: int, limits: SMLimits = HOPPER) -> int:
    """CTAs of one kernel that an SM holds at once: the least of what its registers, threads, shared memory and
    CTA slots allow (at least 1: a kernel that launches at all runs one).

    Args:
        registers: per thread, as ptxas reports them (``n_regs`` of Triton's compiled kernel).
        num_warps: warps per CTA.
        shared_bytes: shared memory per CTA (``metadata.shared``).
    """
    per_warp = -(-max(registers, 1) * 32 // limits.register_unit) * limits.register_unit
    by_registers = limits.registers // per_warp // num_warps
    by_threads = limits.threads // (32 * num_warps)
    by_shared = limits.shared_bytes // (shared_bytes + limits.shared_reserved)
    return max(1, min(by_registers, by_threads, by_shared, limits.ctas))


def ctas_from_compiled(compiled: Any, limits: SMLimits, fallback: int) -> int:
    """:func:`resident_ctas` of a Triton ``CompiledKernel`` (its registers, warps and shared memory), or ``fallback``
    when there is none (``warmup`` returns None under the interpreter and while the compile check records)."""
    if compiled is None:
        return fallback
    compiled._init_handles()  # loads the binary: n_regs and n_spills come from the driver
    ctas = resident_ctas(compiled.n_regs, compiled.metadata.num_warps, compiled.metadata.shared, limits)
    logger.debug(
        "%s: %d registers, %d spilled, %d B shared, %d warps -> %d CTAs per SM",
        compiled.name, compiled.n_regs, compiled.n_spills, compiled.metadata.shared, compiled.metadata.num_warps, ctas,
    )  # fmt: skip
    return ctas


def sm_resources(device: torch.device) -> tuple[int, SMLimits]:
    """(SM count, per-SM limits) of ``device``; off CUDA an H100's, so that grids are sized as on that GPU."""
    if device.type != "cuda":
        return SM_COUNT_OFF_CUDA, HOPPER
    props = torch.cuda.get_device_properties(device)
    limits = SMLimits(  # torch names these on recent versions; the sm_90 figures where it does not
        registers=getattr(props, "regs_per_multiprocessor", HOPPER.registers),
        threads=getattr(props, "max_threads_per_multi_processor", HOPPER.threads),
        shared_bytes=getattr(props, "shared_memory_per_multiprocessor", HOPPER.shared_bytes),
    )
    return props.multi_processor_count, limits


_CTAS_PER_SM: dict[tuple[Any, ...], int] = {}


def _specialisation(args: Sequence[Any]) -> tuple[Any, ...]:
    """What Triton specialises a launch on beyond the constexprs: each tensor's dtype and 16-byte alignment, each
    int's being 1 or a multiple of 16 (ints it is told not to specialise on are the caller's to leave out)."""
    return tuple(
        (str(a.dtype), a.data_ptr() % 16 == 0) if isinstance(a, torch.Tensor) else (a == 1, a % 16 == 0)
        for a in args
        if isinstance(a, torch.Tensor | int) and not isinstance(a, bool)
    )


def resident_programs(
    kernel: Any, args: Sequence[Any], constexprs: Mapping[str, Any], device: torch.device, fallback_ctas: int
) -> int:
    """Programs of ``kernel`` launched with ``args`` and ``constexprs`` (``num_warps`` among them) that ``device``
    holds at once: CTAs per SM from the compiled kernel (remembered per kernel, device and specialisation) times
    the SM count. Off CUDA ``fallback_ctas`` per SM (the kernel is not compiled there)."""
    sms, limits = sm_resources(device)
    key = (kernel, str(device), tuple(sorted(constexprs.items())), _specialisation(args))
    if key not in _CTAS_PER_SM:
        compiled = kernel.warmup(*args, grid=(1,), **constexprs) if device.type == "cuda" else None
        _CTAS_PER_SM[key] = ctas_from_compiled(compiled, limits, fallback_ctas)
    return _CTAS_PER_SM[key] * sms
