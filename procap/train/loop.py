"""The optimisation loop shared by VQGAN, stage-1 and stage-2 training.

One :class:`Trainer` runs steps over an :class:`~procap.train.datasets.EpochBatchSampler`, with bf16 autocast
on CUDA, gradient clipping, a tqdm bar showing loss and throughput, a JSONL log, periodic validation that keeps
the best checkpoint, and ``last`` checkpoints plus training state for ``--resume``. Resuming restores the
weights, optimizer, schedule step, position in the epoch and every RNG, so the continued run computes the same
losses as an uninterrupted one.

Under ``torchrun`` the same loop is data-parallel (:mod:`procap.train.distributed`): the model runs inside
``DistributedDataParallel`` (the frozen VQGAN excluded), each rank takes its slice of every global batch
(:class:`~procap.train.datasets.EpochBatchSampler`), ``grad_accum`` micro-batches make one optimizer step, and only
rank 0 writes checkpoints, the log and validation results (validation runs on rank 0 while the others wait).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

from procap.core.errors import ProCapError
from procap.core.files import (
    OutputError,
    RunFolderLock,
    atomic_write_text,
    make_parents,
    refuse_inputs,
    remove_dead_temps,
    remove_empty,
    writing,
)
from procap.core.json_files import read_json, read_json_lines
from procap.core.logs import TO_STDOUT
from procap.train import distributed
from procap.train.config import MAX_STEPS, TrainConfig, filled, resume_mismatches
from procap.train.datasets import EpochBatchSampler, EpochDataset
from procap.train.run_folder import MARKER, RunFolder, run_files
from procap.train.run_guard import StopRequests, TrainingInterrupted
from procap.train.schedules import StepSchedule
from procap.train.state import (
    capture_rng_state,
    commit_resumable,
    has_resumable,
    load_training_state,
    recover_resumable,
    save_training_state,
    state_paths,
)
from procap.train.tracking import RunTrackers

logger = logging.getLogger(__name__)

MIN_LOGGED_POINTS = 20  # a run logs at least this many training records (when it has that many steps)

LossFn = Callable[[dict[str, Any]], dict[str, torch.Tensor]]
SaveFn = Callable[[Path, dict[str, Any]], object]  # what it returns (the path written) is not read
LoadFn = Callable[[Path], None]
ValidateFn = Callable[[int], dict[str, float]]
WeightFn = Callable[[dict[str, Any]], torch.Tensor]


class LossModule(torch.nn.Module):
    """``model`` plus its loss as one ``forward(batch)``: what DDP wraps, so its gradient hooks see every step."""

    def __init__(self, model: torch.nn.Module, loss_fn: LossFn) -> None:
        super().__init__()
        self.model, self.loss_fn = model, loss_fn

    def forward(self, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        return self.loss_fn(batch)


def frozen_names(module: torch.nn.Module) -> list[str]:
    """Parameters that do not train and the buffers of submodules holding them (DDP leaves both alone)."""
    names = [n for n, p in module.named_parameters() if not p.requires_grad]
    owners = {n.rsplit(".", 1)[0] + "." for n in names if "." in n}
    return names + [n for n, _ in module.named_buffers() if any(n.startswith(o) for o in owners)]


class JsonlLog:
    """Append-only JSON-lines log (one record per line), flushed after every record."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def write(self, record: dict[str, Any]) -> None:
        with writing(self.path):
            self.path.parent.mkdir(
                parents=True, exist_ok=True
            )  # here, not at construction: a failed start leaves nothing
            with self.path.open("a", encoding="utf-8") as handle:
                handle.write(json.dumps(record) + "\n")

    def records(self) -> list[dict[str, Any]]:
        """Every record written so far (none before the first); a line that is not JSON is refused."""
        return read_json_lines(self.path, "log")


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
    total = int(cfg.epochs) * batches_per_epoch
    if total > MAX_STEPS:
        raise ProCapError(
            f"--epochs {cfg.epochs} is {total:,} steps of {batches_per_epoch:,} batches, more than the {MAX_STEPS:,} "
            "a run may take; lower --epochs or raise --batch-size."
        )
    return total


def validation_line(stage: str, step: int, metrics: dict[str, float], run: str | None = None) -> str:
    """One console line of validation scores: caption metrics as they are, fractions (``acc_*``, ``distinct``,
    ``correctness``) in %.

    ``run`` (the run folder's name) tells apart the lines of runs that train side by side (``procap demo``).
    """

    def shown(name: str, value: float) -> str:
        if name.startswith("acc_") or name in ("distinct", "correctness"):
            return f"{name} {100 * value:.1f}%"
        return f"{name} {value:.2f}"

    where = f" ({run})" if run else ""
    return f"{stage} step {step} validation{where}: " + ", ".join(shown(k, float(v)) for k, v in metrics.items())


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
        weight_fn: optional ``batch -> number of loss terms`` (e.g. non-PAD caption tokens) when ``loss`` is a
            mean over those terms: micro-batches and ranks are then weighted by it, so the step's loss and
            gradient equal those of one batch of the global size. Without it every micro-batch weighs the same.
        find_unused: some trainable parameters get no gradient in this stage (DDP must look for them).
    """

    def __init__(
        self,
        cfg: TrainConfig,
        model: torch.nn.Module,
        dataset: EpochDataset,
        loss_fn: LossFn,
        make_optimizer: Callable[[int], tuple[torch.optim.Optimizer, StepSchedule]],
        save_weights: SaveFn,
        load_weights: LoadFn,
        validate: ValidateFn | None = None,
        metric: str | None = None,
        name: str = "train",
        weight_fn: WeightFn | None = None,
        find_unused: bool = True,
    ) -> None:
        self.cfg, self.model, self.dataset, self.loss_fn = cfg, model, dataset, loss_fn
        self.save_weights, self.load_weights, self.validate, self.metric = save_weights, load_weights, validate, metric
        self.weight_fn, self.name = weight_fn, name
        self.ctx, self.device = distributed.setup(cfg.torch_device(), cfg.dist_timeout)
        self.out = Path(cfg.out)
        self.sampler = self._batch_sampler(len(dataset))
        self.total = total_steps(cfg, self.sampler.steps_per_epoch)
        # A short run logs more often than --log-every, so that its loss curve has points to draw (a 10-step stage 1
        # logged one point at step 10).
        self.log_every = max(1, min(cfg.log_every, self.total // MIN_LOGGED_POINTS))
        distributed.seed_rank(cfg.seed, self.ctx)
        module = LossModule(model, loss_fn)  # names as DDP sees them: "model.vqgan..."
        self.wrapped = distributed.wrap_ddp(module, self.ctx, self.device, frozen_names(module), find_unused)
        self.optimizer, self.schedule = make_optimizer(self.total)
        self.log = JsonlLog(self.out / "log.jsonl")
        self.trackers = RunTrackers((), self.out, name, {})  # the real ones start with the run (fit)
        self.state = LoopState()
        self._saved_at = time.monotonic()

    def _batch_sampler(self, items: int) -> EpochBatchSampler:
        """This rank's part of every global batch of the ``items`` training items."""
        cfg = self.cfg
        batch_size = filled(cfg.batch_size, "batch_size")
        try:
            sampler = EpochBatchSampler(
                items,
                batch_size,
                cfg.seed,
                num_replicas=self.ctx.world,
                rank=self.ctx.rank,
                accumulation=cfg.grad_accum,
            )
        except ValueError as exc:
            raise ProCapError(f"--batch-size {batch_size}: {exc}") from None
        if sampler.batch_size < batch_size and self.ctx.is_main:
            # One process clamps to the data; say so, since a whole split per step can take gigabytes.
            logger.warning(
                "%s: --batch-size %d is more than the %d training items; each step takes all %d (lower --batch-size "
                "to use less memory)",
                self.name,
                batch_size,
                items,
                items,
            )
        return sampler

    # ------------------------------------------------------------------ checkpoints
    @property
    def last_path(self) -> Path:
        return self.out / "last.safetensors"

    @property
    def best_path(self) -> Path:
        return self.out / "best.safetensors"

    def save_last(self) -> None:
        """Rank 0 writes ``last`` and its training state (with every rank's RNG streams) as one unit
        (:func:`~procap.train.state.commit_resumable`); all ranks must call."""
        self._saved_at = time.monotonic()
        scalars = {
            "step": self.state.step,
            "epoch": self.state.epoch,
            "batch_in_epoch": self.state.batch_in_epoch,
            "best_metric": self.state.best_metric if math.isfinite(self.state.best_metric) else None,
            "best_step": self.state.best_step,
            "schedule": self.schedule.state_dict(),
            "history": self.state.history,
            "total_steps": self.total,
            "global_batch": self.sampler.global_batch,
        }
        rngs = distributed.gather_to_main(capture_rng_state(), self.ctx) if self.ctx.enabled else None
        if not self.ctx.is_main:
            return

        def write(staged: Path) -> None:
            self.save_weights(staged, {"step": self.state.step, "stage": self.name})
            save_training_state(staged, self.optimizer, scalars, rank_rngs=rngs)

        commit_resumable(self.last_path, write)
        logger.debug("%s: saved step %d to %s", self.name, self.state.step, self.last_path)

    def _check_resumable(self) -> None:
        """Refuse a resume without a saved state to resume from."""
        if not has_resumable(self.last_path):
            raise ProCapError(
                f"--resume: no checkpoint to resume in {self.out} (expected {self.last_path.name} and its .state files)"
            )

    def _check_resumed_options(self) -> None:
        """Refuse a resume whose options contradict the run's config file (the command line fills the options it
        is not given from that file; a program passes the run's own TrainConfig)."""
        if not self.config_path.is_file():
            return  # an older run or a deleted file: resumed from the options given, as the command line notes
        saved = read_json(self.config_path, "run config file")
        mismatches = resume_mismatches(self.cfg.replay_dict(), saved) if isinstance(saved, dict) else []
        if mismatches:
            field = mismatches[0]
            raise ProCapError(
                f"--resume: TrainConfig.{field} = {getattr(self.cfg, field)!r} differs from the {saved[field]!r} the "
                f"run in {self.out} was trained with ({self.config_path.name}); resume with the run's own options "
                "or start a new run."
            )

    def _clear_dead_saves(self) -> None:
        """Rank 0, holding the run folder's lock: finish or delete what a save killed part-way left (a logged
        warning naming the save the run goes on from), and delete the temporary files of killed writes."""
        note = recover_resumable(self.last_path)
        if note:
            logger.warning("procap: note: %s.", note)
        for path in run_files(self.out, self.cfg.stage):
            remove_dead_temps(path)

    def resume(self) -> None:
        """Restore weights, optimizer, schedule, position and RNGs from ``<out>/last.*``."""
        if self.ctx.is_main:
            self._clear_dead_saves()
        distributed.barrier(self.ctx)  # the other ranks read the files rank 0 may just have moved into place
        self._check_resumable()
        self.load_weights(self.last_path)
        scalars = load_training_state(self.last_path, self.optimizer, rank=self.ctx.rank)
        if scalars.get("global_batch", self.sampler.global_batch) != self.sampler.global_batch:
            raise ProCapError(
                f"--resume: {self.out} was trained with a global batch of {scalars['global_batch']}, this run has "
                f"{self.sampler.global_batch} (batch size x processes x --grad-accum); keep them equal"
            )
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
        logger.debug("%s: resumed %s at step %d of %d", self.name, self.last_path, self.state.step, self.total)

    # ------------------------------------------------------------------ one step
    def _autocast(self) -> torch.autocast:
        enabled = self.cfg.amp and self.device.type == "cuda"
        return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16, enabled=enabled)

    def _micro_scales(self, batches: list[dict[str, Any]]) -> list[float | torch.Tensor]:
        """Loss multipliers that make DDP's rank average over micro-batch means the global batch's mean."""
        if self.weight_fn is None or self.sampler.parts == 1:  # one part: its own mean is the batch's
            return [1.0 / len(batches)] * len(batches)
        counts = [self.weight_fn(b).to(self.device, torch.float32) for b in batches]
        total = distributed.all_sum(torch.stack(counts).sum(), self.ctx).clamp(min=1.0)
        return [c * self.ctx.world / total for c in counts]

    def train_step(self, batch: dict[str, Any] | list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        """Forward and backward over the step's micro-batches, then clip, optimizer and schedule step.

        Args:
            batch: one batch, or the ``grad_accum`` micro-batches of one optimizer step.

        Returns:
            The step's scalars as detached device tensors (this rank's; :meth:`fit` averages them over ranks on
            logging steps): reading them syncs with the device, so :meth:`fit` converts them only then.
        """
        batches = batch if isinstance(batch, list) else [batch]
        self.wrapped.train()
        self.optimizer.zero_grad(set_to_none=True)
        record: dict[str, torch.Tensor] = {}
        for i, (micro, scale) in enumerate(zip(batches, self._micro_scales(batches))):
            last = i == len(batches) - 1
            wrapped = self.wrapped  # DDP under torchrun (distributed.wrap_ddp), the module itself otherwise
            sync = (
                wrapped.no_sync()
                if isinstance(wrapped, DistributedDataParallel) and not last
                else contextlib.nullcontext()
            )
            with sync:
                with self._autocast():
                    out = self.wrapped(to_device(micro, self.device))
                (out["loss"] * scale).backward()
            for k, v in out.items():
                if torch.is_tensor(v) and v.numel() == 1:
                    part = v.detach().float() * (scale if k == "loss" else 1.0 / len(batches))
                    record[k] = record[k] + part if k in record else part
        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        grad_norm = torch.nn.utils.clip_grad_norm_(params, self.cfg.grad_clip) if self.cfg.grad_clip > 0 else None
        self.optimizer.step()
        self.schedule.step()
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
        """Validate on rank 0 (the others wait at a barrier) and keep ``best``; returns rank 0's metrics."""
        if self.validate is None:
            return {}
        if not self.ctx.is_main:
            distributed.barrier(self.ctx)
            return {}
        try:
            return self._validate_main(self.validate)
        finally:
            distributed.barrier(self.ctx)

    def _validate_main(self, validate: ValidateFn) -> dict[str, float]:
        self.model.eval()
        metrics = validate(self.state.step)
        record = {"step": self.state.step, "epoch": self.state.epoch, **{f"val/{k}": v for k, v in metrics.items()}}
        self.log.write(record)
        self.trackers.write(record)
        self.state.history.append(record)
        run_name = Path(self.cfg.out).name  # not self.out's: a replacing run writes in a folder of another name
        logger.info(validation_line(self.name, self.state.step, metrics, run_name), extra=TO_STDOUT)
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

    def _after_step(self, stop: StopRequests) -> None:
        """Save when due and stop on Ctrl-C / SIGTERM, decided together by all ranks (one tiny collective).

        The clock of ``--save-minutes`` and the arrival of a signal differ between ranks; acting on them alone
        would leave one rank in a collective the others never join.
        """
        save, stopping = distributed.any_rank([self._save_due(), stop.signum is not None], self.ctx, self.device)
        if save or stopping:
            self.save_last()
        if stopping:
            raise TrainingInterrupted(
                f"saved step {self.state.step} to {self.last_path}; continue with --resume", stop.signum or 15
            )

    def fit(self, finish: Callable[[Path], None] | None = None) -> LoopState:
        """Train to ``total`` steps; returns the final state. Writes ``last``/``best`` checkpoints and the log.

        The run folder is checked first (:mod:`procap.train.run_folder`: it holds no run, this run's own with
        ``--resume``, or any with ``--overwrite``) and locked against a second writer for the whole run (by rank 0,
        the only writer). Ctrl-C or SIGTERM end the step in flight, save ``last`` (resumable with ``--resume``)
        and raise :class:`TrainingInterrupted`; a run replacing another is discarded instead, leaving the old one.

        Args:
            finish: called by rank 0 with the run folder after the last step, to write the stage's final files
                before the run is marked finished.
        """
        run, created = self._claim_folder()
        lock = RunFolderLock(run.final) if run is not None else contextlib.nullcontext()
        with lock, StopRequests() as stop:
            try:
                self._start(run)
                try:
                    state = self._fit(stop)
                finally:
                    self.trackers.close()
                if run is not None:
                    self._finish(run, finish)
            except OutputError as exc:
                self._clean_after_output_error(exc, run, created)
                raise
            except TrainingInterrupted as exc:
                if run is None or not run.replacing:
                    raise
                raise self._discard_interrupted(run, exc) from None
            except BaseException:
                if run is not None:
                    run.discard()
                raise
        distributed.barrier(self.ctx)
        return state

    def _claim_folder(self) -> tuple[RunFolder | None, list[Path]]:
        """Rank 0's :class:`RunFolder` (None on the other ranks) and the folders made above the log, once every
        check that needs no work has passed."""
        run = RunFolder(self.cfg) if self.ctx.is_main else None  # refuses a folder this run may not write
        if self.cfg.resume:
            self._check_resumable()  # before anything is created
            self._check_resumed_options()
        # an --init or --vqgan inside --out would be overwritten at the first save: refuse before any work
        refuse_inputs(self.last_path, *state_paths(self.last_path), self.best_path, self.config_path, self.log.path)
        created = make_parents(self.out / "log.jsonl") if self.ctx.is_main else []
        return run, created

    def _start(self, run: RunFolder | None) -> None:
        """Point the files at a replacing run's folder, resume, and on rank 0 mark the run, write its config and
        start the trackers."""
        if run is not None and run.replacing:
            self._write_into(run.begin())
        if self.cfg.resume:
            self.resume()
        if run is None:
            return
        run.mark("running")
        config = {**self.cfg.replay_dict(), "data_parallel": self.layout()}
        atomic_write_text(self.config_path, json.dumps(config, indent=1))
        if self.sampler.parts > 1:
            logger.info("%s: %s", self.name, self.layout_text())
        self.trackers = RunTrackers(
            self.cfg.loggers, self.out, self.name, config, self.cfg.wandb_project, self.cfg.wandb_name
        )

    def _finish(self, run: RunFolder, finish: Callable[[Path], None] | None) -> None:
        """Rank 0 after the last step: the stage's final files, then the run marked finished in its folder."""
        if finish is not None:
            finish(self.out)
        run.finish()
        self._write_into(run.final)

    def _discard_interrupted(self, run: RunFolder, exc: TrainingInterrupted) -> TrainingInterrupted:
        """A replacing run stopped by a signal is discarded (its ``last`` cannot be resumed: the folder it was
        saved in is not the run's); the error to raise says so."""
        run.discard()
        return TrainingInterrupted(
            f"stopped at step {self.state.step}; the replacing run was discarded and the run in {run.final} "
            "was left as it was",
            exc.signum,
        )

    def _clean_after_output_error(self, exc: OutputError, run: RunFolder | None, created: list[Path]) -> None:
        """What a failed write leaves: a replacing run discarded, a new run's folder removed unless it holds a
        checkpoint; ``exc.note`` says which (the caller raises ``exc``)."""
        if run is not None and run.replacing:
            run.discard()
            exc.note = f"the run in {run.final} was left as it was"
            return
        if self.last_path.is_file():
            return
        if created:  # a new folder with a config and a log but no checkpoint would look like a run
            for path in (self.out / MARKER, self.config_path, self.log.path):
                path.unlink(missing_ok=True)
            remove_empty(created)
            exc.note = "nothing of this run was kept"
        else:
            exc.note = f"{self.out} holds this run's config and log but no checkpoint to --resume from"

    def _write_into(self, folder: Path) -> None:
        """Point every file of the run (checkpoints, log) at ``folder``."""
        self.out = Path(folder)
        self.log = JsonlLog(self.out / "log.jsonl")

    @property
    def config_path(self) -> Path:
        return self.out / f"{self.name}_config.json"

    def layout(self) -> dict[str, int]:
        """The data-parallel layout: per-process batch, processes, accumulation and the global batch per step."""
        return {
            "batch_per_process": self.sampler.batch_size,
            "processes": self.ctx.world,
            "grad_accum": self.cfg.grad_accum,
            "global_batch": self.sampler.global_batch,
        }

    def layout_text(self) -> str:
        lay = self.layout()
        return (
            f"global batch {lay['global_batch']} = {lay['batch_per_process']} per process x {lay['processes']} "
            f"process(es) x {lay['grad_accum']} accumulation step(s)"
        )

    def _steps(self) -> Iterator[list[dict[str, Any]]]:
        """The rest of the current epoch as lists of ``grad_accum`` micro-batches (one list per optimizer step)."""
        group: list[dict[str, Any]] = []
        for batch in self._loader():
            group.append(batch)
            if len(group) == self.cfg.grad_accum:
                yield group
                group = []

    def _log_step(self, record: dict[str, torch.Tensor], rate: float, bar: Any) -> None:
        values = self.scalars(distributed.all_mean(record, self.ctx))  # the only host sync of a training step
        if not self.ctx.is_main:
            return
        bar.set_postfix(loss=f"{values['loss']:.3f}", items_s=f"{rate:.1f}")
        line = {"step": self.state.step, "epoch": self.state.epoch, "lr": self.schedule.lrs(), "items_per_s": rate}
        line.update(values)
        self.log.write(line)
        self.trackers.write(line)

    def _fit(self, stop: StopRequests) -> LoopState:
        from tqdm.auto import tqdm

        self._saved_at = time.monotonic()
        bar = tqdm(
            total=self.total,
            initial=self.state.step,
            desc=self.name,
            disable=not (self.cfg.progress and self.ctx.is_main),
            dynamic_ncols=True,
            leave=False,
        )
        validated_at = -1
        t0, items = time.perf_counter(), 0
        while self.state.step < self.total:
            for group in self._steps():
                record = self.train_step(group)
                self.state.step += 1
                self.state.batch_in_epoch += 1
                items += self.sampler.global_batch
                bar.update(1)
                if self._due(self.log_every) or self.state.step == self.total:
                    self._log_step(record, items / max(time.perf_counter() - t0, 1e-9), bar)
                if self._due(self.cfg.val_every):
                    self.run_validation()
                    validated_at = self.state.step
                self._after_step(stop)
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
