"""Run trackers beside ``log.jsonl``: TensorBoard (``torch.utils.tensorboard``) and Weights & Biases.

Every record the training loop writes to ``log.jsonl`` (training steps, validation scores) also goes, as scalars at
its ``step``, to each tracker named in ``TrainConfig.loggers``. TensorBoard writes event files under
``<out>/tensorboard``; wandb runs under ``<out>`` and honours ``WANDB_MODE`` (``offline`` needs no account and sends
nothing; ``wandb sync`` uploads later). The wandb project and run name come from the flags (``--wandb-project``,
``--wandb-name``), else ``WANDB_PROJECT`` / ``WANDB_NAME``, else ``procap`` and the stage. Both packages are optional
extras (``[tensorboard]``, ``[wandb]``).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from procap.core.extras import require


def scalars(record: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """The finite numbers of a log record, nested dicts and lists flattened into ``a/b`` / ``a/0`` names."""
    out: dict[str, float] = {}
    for key, value in record.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(scalars(value, f"{name}/"))
        elif isinstance(value, (list, tuple)):
            out.update(scalars({str(i): v for i, v in enumerate(value)}, f"{name}/"))
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            out[name] = float(value)
    return out


def wandb_identity(stage: str, project: str | None = None, run_name: str | None = None) -> tuple[str, str]:
    """``(project, run name)`` of a wandb run: the flags, else ``WANDB_PROJECT`` / ``WANDB_NAME``, else ``procap`` and
    the stage.

    wandb reads those variables only when ``init`` is given no value, and procap always gives one, so it reads them
    here (at each run, not at import: a variable set later still counts)."""
    project = project or os.environ.get("WANDB_PROJECT") or "procap"
    run_name = run_name or os.environ.get("WANDB_NAME") or stage
    return project, run_name


class RunTrackers:
    """The trackers of one training stage; a no-op without any.

    Args:
        names: ``"tensorboard"`` and/or ``"wandb"``.
        out: the run folder.
        stage: the stage's name (``stage1``, ``stage2``, ``vqgan``): the wandb run's name and the scalars' prefix.
        config: the resolved training options, stored with the wandb run.
        project, run_name: the wandb project and run name (see the module docstring for the defaults).
    """

    def __init__(
        self,
        names: tuple[str, ...],
        out: Path,
        stage: str,
        config: dict[str, Any],
        project: str | None = None,
        run_name: str | None = None,
    ) -> None:
        self.stage = stage
        self._tensorboard = None
        self._wandb_run = None
        if "tensorboard" in names:
            require("tensorboard", "--logger tensorboard")
            from torch.utils.tensorboard import SummaryWriter

            self._tensorboard = SummaryWriter(log_dir=str(out / "tensorboard"))
        if "wandb" in names:
            wandb = require("wandb", "--logger wandb")
            project, run_name = wandb_identity(stage, project, run_name)
            self._wandb_run = wandb.init(project=project, name=run_name, dir=str(out), config=config, reinit=True)

    def write(self, record: dict[str, Any]) -> None:
        """Send a ``log.jsonl`` record (it carries ``step``) to every tracker."""
        step = int(record.get("step", 0))
        values = {f"{self.stage}/{k}": v for k, v in scalars(record).items() if k not in ("step", "epoch")}
        if not values:
            return
        if self._tensorboard is not None:
            for name, value in values.items():
                self._tensorboard.add_scalar(name, value, step)
        if self._wandb_run is not None:
            self._wandb_run.log(values, step=step)

    def close(self) -> None:
        if self._tensorboard is not None:
            self._tensorboard.close()
            self._tensorboard = None
        if self._wandb_run is not None:
            self._wandb_run.finish()
            self._wandb_run = None
