"""Data-parallel training with PyTorch's own engine: ``torchrun`` + ``DistributedDataParallel``.

The same command runs on one CPU, one GPU, N GPUs or several nodes: under ``torchrun`` (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK`` and ``MASTER_ADDR`` in the environment) :func:`setup` joins the process group (``nccl`` on CUDA,
``gloo`` on CPU) with a timeout, so a rank that dies makes the others fail with a clear error instead of
hanging; without those variables everything here is a no-op for a single process.

Rank 0 writes checkpoints, logs and validation results; every rank reads them back on ``--resume``.
"""

from __future__ import annotations

import dataclasses
import datetime
import inspect
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from procap.core.errors import ProCapError
from procap.core.validate import environment_integer
from procap.train.state import has_resumable

# Offset between the RNG seeds of consecutive ranks: rank 0 keeps the single-process seed.
RANK_SEED_STRIDE = 1_000_003


@dataclass(frozen=True)
class DistContext:
    """Where this process stands in the job: ``rank`` of ``world`` processes, ``local_rank`` on its node."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def launched_by_torchrun() -> bool:
    """True when the environment names a multi-process job (``torchrun`` sets ``WORLD_SIZE`` and ``RANK``)."""
    return environment_integer("WORLD_SIZE", 1, minimum=1) > 1 and "RANK" in os.environ


def env_context() -> DistContext:
    """Rank, world size and local rank from the ``torchrun`` environment (single process without it)."""
    if not launched_by_torchrun():
        return DistContext()
    if "LOCAL_RANK" not in os.environ:
        raise ProCapError("torchrun environment is incomplete (LOCAL_RANK is not set); launch with torchrun")
    world = environment_integer("WORLD_SIZE", 1, minimum=1)
    rank, local_rank = environment_integer("RANK", 0), environment_integer("LOCAL_RANK", 0)
    if rank >= world:
        raise ProCapError(f"environment variable RANK={rank} must be below WORLD_SIZE={world}; launch with torchrun")
    return DistContext(rank, world, local_rank)


def setup(device: torch.device, timeout_minutes: float = 30.0) -> tuple[DistContext, torch.device]:
    """Join the process group when launched by ``torchrun``; returns the context and this rank's device.

    On CUDA each rank uses ``cuda:LOCAL_RANK`` (a ``--device cuda`` without an index is made rank-local).
    ``timeout_minutes`` bounds every collective: a peer that died or hangs ends the job with an error.
    """
    ctx = env_context()
    if not ctx.enabled:
        return ctx, device
    if device.type == "cuda":
        if device.index is None:
            device = torch.device("cuda", ctx.local_rank)
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        timeout = datetime.timedelta(minutes=timeout_minutes)
        store, rank, world = next(dist.rendezvous("env://", timeout=timeout))
        # A torchrun restart can reuse the agent's store: without a per-attempt prefix the new workers may read
        # the dead workers' addresses (gloo: "Connection refused" on restart).
        store = dist.PrefixStore(f"procap/attempt{restart_count()}", store)
        dist.init_process_group(
            backend,
            store=store,
            rank=rank,
            world_size=world,
            timeout=timeout,
            device_id=device if backend == "nccl" else None,
        )
    return ctx, device


def restart_count() -> int:
    """How many times ``torchrun --max-restarts`` has restarted this job's workers (0 on the first attempt)."""
    try:
        return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    except ValueError:
        return 0


def resume_after_restart(cfg: Any) -> Any:
    """``cfg`` with ``resume=True`` when torchrun restarted the workers and ``<out>`` holds a saved state.

    ``torchrun --max-restarts N`` runs the same command again after a failure; without this the restarted job
    would start from step 0 (or, with ``--resume`` on the first attempt, fail for lack of a checkpoint). A run
    with ``--overwrite`` trains beside ``<out>`` until it ends, so ``<out>``'s saved state is the replaced run's:
    its restart starts over.
    """
    last = Path(cfg.out) / "last.safetensors"
    if cfg.resume or cfg.overwrite or restart_count() == 0 or not has_resumable(last):
        return cfg
    return dataclasses.replace(cfg, resume=True)


def teardown() -> None:
    """Leave the process group (idempotent)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def seed_rank(seed: int, ctx: DistContext) -> None:
    """Give rank ``r > 0`` its own torch/NumPy/Python streams (dropout, negatives); rank 0 keeps ``seed``'s."""
    if ctx.rank == 0:
        return
    rank_seed = seed + RANK_SEED_STRIDE * ctx.rank
    torch.manual_seed(rank_seed)
    np.random.seed(rank_seed % 2**32)
    random.seed(rank_seed)


def all_mean(values: dict[str, torch.Tensor], ctx: DistContext) -> dict[str, torch.Tensor]:
    """Average scalar tensors over ranks (one collective); identity for a single process."""
    if not ctx.enabled or not values:
        return values
    keys = sorted(values)
    stacked = torch.stack([values[k].detach().float().reshape(()) for k in keys])
    dist.all_reduce(stacked)
    return {k: v / ctx.world for k, v in zip(keys, stacked)}


def any_rank(flags: list[bool], ctx: DistContext, device: torch.device) -> list[bool]:
    """Element-wise OR of boolean flags over ranks, so every rank takes the same branch (save, stop)."""
    if not ctx.enabled:
        return flags
    tensor = torch.tensor([float(f) for f in flags], device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return [bool(v) for v in tensor.tolist()]


def all_sum(value: torch.Tensor, ctx: DistContext) -> torch.Tensor:
    """Sum of a tensor over ranks (a copy); identity for a single process."""
    if not ctx.enabled:
        return value
    value = value.detach().clone()
    dist.all_reduce(value)
    return value


def gather_to_main(obj: Any, ctx: DistContext) -> list[Any] | None:
    """Every rank's ``obj`` on rank 0 (``None`` elsewhere); ``[obj]`` for a single process."""
    if not ctx.enabled:
        return [obj]
    out = [None] * ctx.world if ctx.is_main else None
    dist.gather_object(obj, out, dst=0)
    return out


def barrier(ctx: DistContext) -> None:
    if ctx.enabled:
        dist.barrier()


def wrap_ddp(
    module: torch.nn.Module, ctx: DistContext, device: torch.device, frozen: list[str], find_unused: bool = True
) -> torch.nn.Module:
    """``DistributedDataParallel(module)`` for a multi-process job, ``module`` itself otherwise.

    Args:
        frozen: names of parameters and buffers DDP must neither broadcast nor reduce (the frozen VQGAN).

    ``find_unused``: stage 1 does not use the decoder and stage 2 not the stage-1 heads; DDP leaves the gradient
    of a parameter that no rank used untouched, so AdamW skips it exactly as in a single process. A model that
    uses every parameter (the VQGAN) passes False and saves a graph traversal per step.
    """
    if not ctx.enabled:
        return module
    from torch.nn.parallel import DistributedDataParallel

    DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(module, frozen)
    ids = [device.index] if device.type == "cuda" else None
    # No buffer broadcast on every forward (the trained parts hold no running statistics); the name changed in
    # torch 2.13 (``forward_sync_buffers``), older releases only know ``broadcast_buffers``.
    params = inspect.signature(DistributedDataParallel.__init__).parameters
    if "forward_sync_buffers" in params:
        return DistributedDataParallel(
            module, device_ids=ids, find_unused_parameters=find_unused, forward_sync_buffers=False
        )
    return DistributedDataParallel(module, device_ids=ids, find_unused_parameters=find_unused, broadcast_buffers=False)
