"""Fit the VQGAN tokenizer to a dataset by reconstruction: L1 + codebook + commitment (no GAN term).

Small codebooks trained briefly collapse onto a few codes, which would leave the stage-1 MSM targets nearly
constant. Two standard remedies keep the codebook in use: the codebook is initialised from encoder outputs of
the first batch, and codes unused over the last ``restart_every`` steps are re-seeded from current latents.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from procap.core.config import get_preset
from procap.core.errors import ProCapError
from procap.core.extras import require_all
from procap.core.weights import load_module_state, load_weights
from procap.data import load_split
from procap.data.images import ImageCache
from procap.model.procap import ProCap
from procap.model.vqgan import VQGAN
from procap.train import distributed
from procap.train.config import TrainConfig
from procap.train.datasets import ImageDataset
from procap.train.loop import LossFn, Trainer
from procap.train.schedules import StepSchedule, warmup_schedule


def save_vqgan(path: Path | str, vqgan: VQGAN, extra: dict[str, Any] | None = None) -> Path:
    """VQGAN weights in safetensors with its :class:`VQGANConfig` in the metadata (:meth:`VQGAN.save`)."""
    return vqgan.save(path, extra)


def load_vqgan(path: Path | str) -> VQGAN:
    """Rebuild a VQGAN saved by :func:`save_vqgan` (no pickle): :meth:`VQGAN.load`."""
    return VQGAN.load(path)


def load_vqgan_into(model: ProCap, path: Path | str) -> None:
    """Copy VQGAN weights from ``path`` into ``model.vqgan`` after checking the architectures agree."""
    if VQGAN.read_config(path) != model.vqgan.config:
        raise ProCapError(f"the VQGAN in {path} has a different architecture than the model's preset")
    state, _ = VQGAN.read_saved(path)
    load_weights(model.vqgan, state, path)


class CodebookKeeper:
    """Data-dependent codebook initialisation and dead-code restarts.

    Codes are replaced just before quantisation (never between a forward and its optimizer step), from the
    latents of the batch being encoded. Under data parallelism the usage counts are summed over ranks, so every
    rank restarts the same codes, and rank 0's new rows are broadcast: the codebooks stay identical.
    """

    def __init__(self, vqgan: VQGAN, restart_every: int = 10, initialised: bool = False) -> None:
        self.vqgan, self.restart_every, self.initialised = vqgan, restart_every, initialised
        self.usage = torch.zeros(vqgan.config.n_embed, dtype=torch.long)
        self.steps = 0
        self.pending: torch.Tensor | None = None

    @torch.no_grad()
    def _reseed(self, latents: torch.Tensor, rows: torch.Tensor) -> None:
        weight = self.vqgan.quantize.embedding.weight
        pick = torch.randint(0, latents.shape[0], (rows.numel(),), device=latents.device)
        noise = 0.01 * latents.std() * torch.randn(rows.numel(), latents.shape[1], device=latents.device)
        weight[rows.to(weight.device)] = (latents[pick] + noise).to(weight.dtype)
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.broadcast(weight.data, src=0)

    def _reduce_device(self) -> torch.device:
        """Where a collective on the usage counts runs: NCCL needs them on the GPU."""
        return self.vqgan.quantize.embedding.weight.device

    def before_quantize(self, latents: torch.Tensor) -> None:
        """latents (M, D) of the current batch: initialise the codebook once, then restart dead codes."""
        latents = latents.detach()
        if not self.initialised:
            self._reseed(latents, torch.arange(self.usage.numel()))
            self.initialised = True
        elif self.pending is not None and self.pending.numel():
            self._reseed(latents, self.pending)
        self.pending = None

    def record(self, indices: torch.Tensor) -> None:
        """Count code usage; every ``restart_every`` steps the never-used codes are queued for a restart."""
        self.usage += torch.bincount(indices.flatten().cpu(), minlength=self.usage.numel())
        self.steps += 1
        if self.steps % self.restart_every == 0:
            if torch.distributed.is_available() and torch.distributed.is_initialized():
                self.usage = distributed.all_sum(self.usage.to(self._reduce_device()), distributed.env_context()).cpu()
            self.pending = torch.nonzero(self.usage == 0).flatten()
            self.usage.zero_()


def vqgan_loss(vqgan: VQGAN, keeper: CodebookKeeper | None = None) -> LossFn:
    """Loss function for :class:`Trainer`: ``VQGAN.reconstruction_loss`` with the codebook upkeep hooked in, and
    ``codes_used`` (distinct codes of the batch)."""

    def loss_fn(batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        used: list[torch.Tensor] = []

        def after_quantize(indices: torch.Tensor) -> None:
            used.append(indices)
            if keeper is not None:
                keeper.record(indices)

        before = keeper.before_quantize if keeper is not None else None
        losses = vqgan.reconstruction_loss(batch["image"], before_quantize=before, after_quantize=after_quantize)
        return {**losses, "codes_used": torch.tensor(float(used[0].unique().numel()))}

    return loss_fn


def vqgan_optimizer(vqgan: VQGAN, cfg: TrainConfig, total_steps: int) -> tuple[torch.optim.Optimizer, StepSchedule]:
    """Adam with taming's betas over the whole VQGAN, on the warm-up schedule of :func:`warmup_schedule`."""
    groups = [{"params": list(vqgan.parameters()), "name": "vqgan"}]  # the name labels its lr in the logs
    optimizer = torch.optim.Adam(groups, lr=0.0, betas=(0.5, 0.9), foreach=False)
    return optimizer, StepSchedule(optimizer, [warmup_schedule(cfg, total_steps)])


def train_vqgan(cfg: TrainConfig, pairs: list | None = None) -> Path:
    """Train the preset's VQGAN on every image of the training split; returns ``<out>/vqgan.safetensors``."""
    cfg = distributed.resume_after_restart(cfg.resolved())
    require_all(cfg.optional_packages(), "procap vqgan")  # before any work, not at the first use
    torch.manual_seed(cfg.seed)
    if pairs is None:
        if cfg.data is None:
            raise ProCapError("--data is required: the dataset root folder")
        pairs = load_split(cfg.dataset, cfg.data, "train")
    pairs = pairs[: cfg.max_pairs] if cfg.max_pairs else pairs
    config = get_preset(cfg.preset).vqgan
    ctx, device = distributed.setup(cfg.torch_device(), cfg.dist_timeout)
    vqgan = VQGAN(config).to(device)
    dataset = ImageDataset(pairs, config.resolution, ImageCache(config.resolution, cfg.cache_images))
    keeper = CodebookKeeper(vqgan, initialised=cfg.resume)  # a resumed codebook is already initialised

    def load(path: Path) -> None:
        state, _ = load_module_state(path, "VQGAN weights")
        load_weights(vqgan, state, path)

    trainer = Trainer(
        cfg,
        vqgan,
        dataset,
        vqgan_loss(vqgan, keeper),
        lambda total: vqgan_optimizer(vqgan, cfg, total),
        save_weights=lambda path, extra: save_vqgan(path, vqgan, extra),
        load_weights=load,
        name="vqgan",
        find_unused=False,
    )

    def save_final(folder: Path) -> None:
        save_vqgan(folder / "vqgan.safetensors", vqgan, {"steps": trainer.state.step, "dataset": cfg.dataset})

    trainer.fit(finish=save_final)  # the final weights are written before the run is marked finished
    distributed.barrier(ctx)
    return Path(cfg.out) / "vqgan.safetensors"
