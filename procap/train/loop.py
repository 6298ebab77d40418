"""The optimisation loop shared by VQGAN, stage-1 and stage-2 training.

One :class:`Trainer` runs steps over an :class:`~procap.train.datasets.EpochBatchSampler`, with bf16 autocast
on CUDA, gradient clipping, a tqdm bar showing loss and throughput, a JSONL log, periodic validation that keeps
the best checkpoint, and ``last`` checkpoints plus training state for ``--resume``. Resuming restores the
weights, optimizer, schedule step, position in the epoch and every RNG, so the continued run computes the same
losses as an uninterrupted one.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from procap.checkpoint import load_training_state, save_training_state, state_paths
from procap.errors import ProCapError
from procap.files import atomic_write_text
from procap.train.config import TrainConfig
from procap.train.datasets import EpochBatchSampler
from procap.train.run_guard import RunFolderLock, StopRequests, TrainingInterrupted
from procap.train.schedules import StepSchedule

LossFn = Callable[[dict[str, Any]], dict[str, torch.Tensor]]
SaveFn = Callable[[Path, dict[str, Any]], None]
LoadFn = Callable[[Path], None]
ValidateFn = Callable[[int], dict[str, float]]


class JsonlLog:
    """Append-only JSON-lines log (one record per line), flushed after every record."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def write(self, record: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)  # here, not at construction: a failed start leaves nothing
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")

    def records(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text(encoding="utf-8").splitlines() if line.strip()]


@dataclass
class LoopState:
    """Where training stands; saved as JSON beside the ``last`` checkpoint."""

    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0
    best_metric: float = -math.inf
    best_step: int = -1
    history: list[dict[str, Any]] = field(default_factory=list)


def to_device(batch: dict[str, Any], device: torch.device) -> dict[str, Any]:
    return {k: v.to(device, non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()}


def total_steps(cfg: TrainConfig, batches_per_epoch: int) -> int:
    """``--steps`` when given, else ``--epochs`` x batches per epoch."""
    if cfg.steps is not None:
        return int(cfg.steps)
    if cfg.epochs is None:
        raise ProCapError("give --steps or --epochs")
    return int(cfg.epochs) * batches_per_epoch


class Trainer:
    """Runs one training stage.

    Args:
        cfg: resolved training options (``out``, ``steps``/``epochs``, ``grad_clip``, ``val_every``...).
        model: the module being trained (its ``train()``/``eval()`` mode is managed here).
        dataset: yields dict items; must have ``set_epoch(epoch)``.
        loss_fn: batch (on device) -> dict with a scalar ``loss`` and other scalar metrics to log.
        make_optimizer: ``(total_steps) -> (optimizer, schedule)``.
        save_weights: ``(path, extra)`` writes the model weights (a checkpoint) to ``path``.
        load_weights: ``(path)`` loads them back (for ``--resume``).
        validate: optional ``(step) -> metrics``; ``metric`` names the one that picks ``best.safetensors``.
        items_fn: number of items (pairs/images) and tokens in a batch, for throughput.
    """

    def __init__(
        self,
        cfg: TrainConfig,
        model: torch.nn.Module,
        dataset: Dataset,
        loss_fn: LossFn,
        make_optimizer: Callable[[int], tuple[torch.optim.Optimizer, StepSchedule]],
        save_weights: SaveFn,
        load_weights: LoadFn,
        validate: ValidateFn | None = None,
        metric: str | None = None,
        name: str = "train",
    ) -> None:
        self.cfg, self.model, self.dataset, self.loss_fn = cfg, model, dataset, loss_fn
        self.save_weights, self.load_weights, self.validate, self.metric = save_weights, load_weights, validate, metric
        self.name, self.device = name, cfg.torch_device()
        self.out = Path(cfg.out)
        self.sampler = EpochBatchSampler(len(dataset), cfg.batch_size, cfg.seed)
        self.total = total_steps(cfg, len(self.sampler))
        self.optimizer, self.schedule = make_optimizer(self.total)
        self.log = JsonlLog(self.out / "log.jsonl")
        self.state = LoopState()
        self._saved_at = time.monotonic()

    # ------------------------------------------------------------------ checkpoints
    @property
    def last_path(self) -> Path:
        return self.out / "last.safetensors"

    @property
    def best_path(self) -> Path:
        return self.out / "best.safetensors"

    def save_last(self) -> None:
        self._saved_at = time.monotonic()
        self.save_weights(self.last_path, {"step": self.state.step, "stage": self.name})
        scalars = {
            "step": self.state.step,
            "epoch": self.state.epoch,
            "batch_in_epoch": self.state.batch_in_epoch,
            "best_metric": self.state.best_metric if math.isfinite(self.state.best_metric) else None,
            "best_step": self.state.best_step,
            "schedule": self.schedule.state_dict(),
            "history": self.state.history,
            "total_steps": self.total,
        }
        save_training_state(self.last_path, self.optimizer, scalars)

    def _check_resumable(self) -> None:
        if not self.last_path.is_file() or not state_paths(self.last_path)[1].is_file():
            raise ProCapError(
                f"--resume: no checkpoint to resume in {self.out} (expected {self.last_path.name} and its .state files)"
            )

    def resume(self) -> None:
        """Restore weights, optimizer, schedule, position and RNGs from ``<out>/last.*``."""
        self._check_resumable()
        self.load_weights(self.last_path)
        scalars = load_training_state(self.last_path, self.optimizer)
        self.schedule.load_state_dict(scalars["schedule"])
        best = scalars.get("best_metric")
        self.state = LoopState(
            step=scalars["step"],
            epoch=scalars["epoch"],
            batch_in_epoch=scalars["batch_in_epoch"],
            best_metric=-math.inf if best is None else best,
            best_step=scalars["best_step"],
            history=scalars.get("history", []),
        )

    # ------------------------------------------------------------------ one step
    def _autocast(self):
        enabled = self.cfg.amp and self.device.type == "cuda"
        return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16, enabled=enabled)

    def train_step(self, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        """Forward, backward, clip, optimizer and schedule step.

        Returns the step's scalars as detached device tensors: reading them syncs with the device, so
        :meth:`fit` converts them only on logging steps (see :meth:`scalars`).
        """
        self.model.train()
        with self._autocast():
            out = self.loss_fn(to_device(batch, self.device))
        self.optimizer.zero_grad(set_to_none=True)
        out["loss"].backward()
        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        grad_norm = torch.nn.utils.clip_grad_norm_(params, self.cfg.grad_clip) if self.cfg.grad_clip > 0 else None
        self.optimizer.step()
        self.schedule.step()
        record = {k: v.detach() for k, v in out.items() if torch.is_tensor(v) and v.numel() == 1}
        if grad_norm is not None:
            record["grad_norm"] = grad_norm.detach()
        return record

    def scalars(self, record: dict[str, torch.Tensor]) -> dict[str, float]:
        """Host floats of a step's record; a non-finite loss stops training with one sentence."""
        values = {k: float(v) for k, v in record.items()}
        if not math.isfinite(values["loss"]):
            raise ProCapError(f"{self.name}: loss became {values['loss']} by step {self.state.step}; lower --lr")
        return values

    # ------------------------------------------------------------------ validation
    def run_validation(self) -> dict[str, float]:
        if self.validate is None:
            return {}
        self.model.eval()
        metrics = self.validate(self.state.step)
        record = {"step": self.state.step, "epoch": self.state.epoch, **{f"val/{k}": v for k, v in metrics.items()}}
        self.log.write(record)
        self.state.history.append(record)
        value = metrics.get(self.metric) if self.metric else None
        if value is not None and value > self.state.best_metric:
            self.state.best_metric, self.state.best_step = float(value), self.state.step
            self.save_weights(
                self.best_path,
                {"step": self.state.step, "stage": self.name, "val": {k: float(v) for k, v in metrics.items()}},
            )
        return metrics

    # ------------------------------------------------------------------ the loop
    def _loader(self) -> DataLoader:
        self.dataset.set_epoch(self.state.epoch)
        self.sampler.set_epoch(self.state.epoch, self.state.batch_in_epoch)
        # A private generator: creating the iterator must not draw from the global RNG (resume determinism).
        return DataLoader(
            self.dataset,
            batch_sampler=self.sampler,
            num_workers=self.cfg.workers,
            generator=torch.Generator().manual_seed(self.cfg.seed + self.state.epoch),
            pin_memory=self.device.type == "cuda",
            persistent_workers=False,
        )

    def _due(self, every: int) -> bool:
        return every > 0 and self.state.step % every == 0

    def _save_due(self) -> bool:
        """``--save-every`` steps, or ``--save-minutes`` since the last save (bounds the work a crash loses)."""
        minutes = self.cfg.save_minutes or 0
        return self._due(self.cfg.save_every) or (minutes > 0 and time.monotonic() - self._saved_at >= 60 * minutes)

    def _stop_if_requested(self, stop: StopRequests) -> None:
        """After a complete step: on Ctrl-C / SIGTERM save ``last`` and raise :class:`TrainingInterrupted`."""
        if stop.signum is None:
            return
        self.save_last()
        raise TrainingInterrupted(
            f"saved step {self.state.step} to {self.last_path}; continue with --resume", stop.signum
        )

    def fit(self) -> LoopState:
        """Train to ``total`` steps; returns the final state. Writes ``last``/``best`` checkpoints and the log.

        The run folder is locked against a second writer for the whole run. Ctrl-C or SIGTERM end the step in
        flight, save ``last`` (resumable with ``--resume``) and raise :class:`TrainingInterrupted`.
        """
        if self.cfg.resume:
            self._check_resumable()  # before anything is created
        self.out.mkdir(parents=True, exist_ok=True)
        with RunFolderLock(self.out), StopRequests() as stop:
            if self.cfg.resume:
                self.resume()
            atomic_write_text(self.out / f"{self.name}_config.json", json.dumps(self.cfg.to_dict(), indent=1))
            return self._fit(stop)

    def _fit(self, stop: StopRequests) -> LoopState:
        from tqdm.auto import tqdm

        self._saved_at = time.monotonic()
        bar = tqdm(
            total=self.total,
            initial=self.state.step,
            desc=self.name,
            disable=not self.cfg.progress,
            dynamic_ncols=True,
            leave=False,
        )
        validated_at = -1
        t0, items = time.perf_counter(), 0
        while self.state.step < self.total:
            for batch in self._loader():
                record = self.train_step(batch)
                self.state.step += 1
                self.state.batch_in_epoch += 1
                items += len(batch["index"]) if "index" in batch else self.cfg.batch_size
                rate = items / max(time.perf_counter() - t0, 1e-9)
                bar.update(1)
                if self._due(self.cfg.log_every) or self.state.step == self.total:
                    values = self.scalars(record)  # the only host sync of a training step
                    bar.set_postfix(loss=f"{values['loss']:.3f}", items_s=f"{rate:.1f}")
                    self.log.write(
                        {
                            "step": self.state.step,
                            "epoch": self.state.epoch,
                            "lr": self.schedule.lrs(),
                            "items_per_s": rate,
                            **values,
                        }
                    )
                if self._due(self.cfg.val_every):
                    self.run_validation()
                    validated_at = self.state.step
                if self._save_due():
                    self.save_last()
                self._stop_if_requested(stop)
                if self.state.step >= self.total:
                    break
            else:
                self.state.epoch += 1
                self.state.batch_in_epoch = 0
                if self.cfg.val_every == 0 and self.state.step < self.total:
                    self.run_validation()
                    validated_at = self.state.step
        bar.close()
        if validated_at != self.state.step:
            self.run_validation()
        self.save_last()
        return self.state
