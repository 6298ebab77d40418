"""Learning-rate schedules and optimisers of the two training stages (paper, docs/training.md).

Schedules are plain functions of the optimisation step, so their whole state is the step count: resuming
needs no pickled closures. :class:`StepSchedule` applies one function per parameter group.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from procap.train.config import TrainConfig, filled

LrFn = Callable[[int], float]


def warmup_lr(
    step: int, start: float, peak: float, warmup_steps: int, total_steps: int = 0, decay: str = "none"
) -> float:
    """Linear warm-up ``start -> peak`` over ``warmup_steps``, then constant (paper) or decayed to 0.

    ``step`` counts optimisation steps already taken (the first update uses ``step = 0``, lr = ``start``).
    ``decay`` = ``cosine`` / ``linear`` anneals from ``peak`` at the end of warm-up to 0 at ``total_steps``.
    """
    if warmup_steps > 0 and step < warmup_steps:
        return start + (peak - start) * step / warmup_steps
    if decay == "none" or total_steps <= warmup_steps:
        return peak
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    if decay == "cosine":
        return peak * 0.5 * (1.0 + math.cos(math.pi * progress))
    return peak * (1.0 - progress)


class StepSchedule:
    """Sets each parameter group's ``lr`` from its own function of the step; state = the step count."""

    def __init__(self, optimizer: torch.optim.Optimizer, fns: list[LrFn]) -> None:
        if len(fns) != len(optimizer.param_groups):
            raise ValueError(f"{len(fns)} schedule functions for {len(optimizer.param_groups)} parameter groups")
        self.optimizer, self.fns, self.step_count = optimizer, fns, 0
        self.apply()

    def apply(self) -> None:
        for group, fn in zip(self.optimizer.param_groups, self.fns):
            group["lr"] = fn(self.step_count)

    def step(self) -> None:
        """Advance after ``optimizer.step()`` so the next update uses the next step's lr."""
        self.step_count += 1
        self.apply()

    def lrs(self) -> dict[str, float]:
        """Each parameter group's lr under its name (``encoder``, ``decoder``...), so logs and trackers say which
        group a value belongs to; a group without a name is ``group<i>``."""
        return {str(group.get("name", f"group{i}")): group["lr"] for i, group in enumerate(self.optimizer.param_groups)}

    def state_dict(self) -> dict[str, int]:
        return {"step": self.step_count}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.step_count = int(state["step"])
        self.apply()


def _adamw(groups: list[dict], cfg: TrainConfig) -> torch.optim.AdamW:
    return torch.optim.AdamW(groups, lr=0.0, betas=(0.9, 0.999), weight_decay=cfg.weight_decay)


def trainable(module: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    return [(n, p) for n, p in module.named_parameters() if p.requires_grad]


def stage1_optimizer(
    model: torch.nn.Module, cfg: TrainConfig, total_steps: int
) -> tuple[torch.optim.Optimizer, StepSchedule]:
    """AdamW over all trainable parameters, lr warm-up ``lr_start -> lr`` over ``warmup_steps`` (1e-6 -> 1e-4, 5k)."""
    params = [p for _, p in trainable(model)]
    optimizer = _adamw([{"params": params, "name": "all"}], cfg)
    return optimizer, StepSchedule(optimizer, [warmup_schedule(cfg, total_steps)])


def warmup_schedule(cfg: TrainConfig, total_steps: int) -> LrFn:
    """``lr_start -> lr`` over ``warmup_steps`` (at most the whole run), then ``decay``: stage 1's and the VQGAN's."""
    start, peak = filled(cfg.lr_start, "lr_start"), filled(cfg.lr, "lr")
    warm = min(filled(cfg.warmup_steps, "warmup_steps"), total_steps)
    return lambda step: warmup_lr(step, start, peak, warm, total_steps, cfg.decay)


def is_decoder_param(name: str) -> bool:
    """Parameters new in stage 2 (caption decoder and the memory MLP) get the warmed-up decoder lr."""
    return name.startswith(("decoder.", "memory")) or ".memory" in name


def stage2_optimizer(
    model: torch.nn.Module, cfg: TrainConfig, total_steps: int
) -> tuple[torch.optim.Optimizer, StepSchedule]:
    """Two groups: the (stage-1 initialised) encoder and the new decoder + memory MLP, decoder warmed up 0 -> lr.

    The paper: encoder constant at ``encoder_lr`` (the dataset's value, e.g. 5e-5) from step 0; decoder lr linear
    warm-up from 0 to 5e-5 over the first ``warmup_frac`` (10%) of the steps. With ``cfg.encoder_warmup`` (the
    default, a departure: docs/model.md) the encoder's lr warms up over the same steps: an encoder at full lr
    while the decoder still reads a uniform average of the memory learns to make the memory input-independent
    (its spread across samples fell 0.23 -> 0.006 within 300 steps), and never recovers.
    """
    named = trainable(model)
    enc = [p for n, p in named if not is_decoder_param(n)]
    dec = [p for n, p in named if is_decoder_param(n)]
    optimizer = _adamw([{"params": enc, "name": "encoder"}, {"params": dec, "name": "decoder"}], cfg)
    warm = round(filled(cfg.warmup_frac, "warmup_frac") * total_steps)
    encoder_lr, decoder_lr = filled(cfg.encoder_lr, "encoder_lr"), filled(cfg.decoder_lr, "decoder_lr")
    enc_start, enc_warm = (0.0, warm) if cfg.encoder_warmup else (encoder_lr, 0)
    enc_fn = lambda s: warmup_lr(s, enc_start, encoder_lr, enc_warm, total_steps, cfg.decay)
    dec_fn = lambda s: warmup_lr(s, 0.0, decoder_lr, warm, total_steps, cfg.decay)
    return optimizer, StepSchedule(optimizer, [enc_fn, dec_fn])
