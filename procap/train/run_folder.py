"""A run folder belongs to one run: the one place that decides whether a training run may write into ``--out``.

Every run writes ``run.json`` into its folder, naming the command that trains it (``vqgan``, ``pretrain``,
``train``) and its state (``running`` until the last checkpoint is written, then ``finished``). A new run may use a
folder that holds no run; ``--resume`` continues a run of its own command (and so does a ``torchrun
--max-restarts`` restart, without ``--resume``: :func:`procap.train.distributed.resume_after_restart`); ``--overwrite`` replaces a run, by
training in a folder beside it and swapping the two only when the new run has finished, so an interrupted or
failed replacement leaves the old run as it was. The swap is :func:`procap.core.files.swap_folder`: two renames with
Ctrl-C deferred between them; a process killed outright between them leaves the old run beside the folder, and the
next run into the folder puts it back (:func:`procap.core.files.recover_swap`, a logged warning), as it deletes the
folders of replacements killed before they finished. Anything else is refused with one sentence before any work: a
finished run replaced its ``best.safetensors`` and ``log.jsonl`` with exit 0, and a stage-2 run pointed at its
stage-1 folder overwrote stage 1's state.

A folder written before markers existed is recognised by its files (``stage1_config.json`` names a ``pretrain``
run, and so on). The checks also hold for paths that come from a ``--config`` file or the Python API: the run
folder may be none of the run's inputs and lie inside none of them.
"""

from __future__ import annotations

import glob
import logging
import os
import shutil
import tempfile
from pathlib import Path

from procap.core.config import UNTRAINED_VQGAN
from procap.core.errors import ProCapError
from procap.core.files import atomic_write_json, beside, input_overlap, recover_swap, refuse_inputs, swap_folder
from procap.core.json_files import read_json
from procap.core.validate import output_apart
from procap.train.config import TrainConfig
from procap.train.distributed import resume_after_restart
from procap.train.state import state_paths

logger = logging.getLogger(__name__)

MARKER = "run.json"
# The name each command's trainer gives its files (<name>_config.json) and its final checkpoint, if any.
RUN_NAMES = {"vqgan": "vqgan", "pretrain": "stage1", "train": "stage2"}
FINAL_CHECKPOINTS = {"vqgan": "vqgan.safetensors", "pretrain": "stage1.safetensors"}
# Files only a training run writes: a folder holding one holds a run, marked or not.
_RUN_FILES = ("log.jsonl", "last.safetensors", "best.safetensors", *FINAL_CHECKPOINTS.values())


def run_files(folder: str | os.PathLike, stage: str) -> list[Path]:
    """Every file a run of ``stage`` writes into ``folder`` (checkpoints, their training state, config, log)."""
    folder = Path(folder)
    last, best = folder / "last.safetensors", folder / "best.safetensors"
    files = [folder / MARKER, last, *state_paths(last), best, folder / f"{RUN_NAMES[stage]}_config.json"]
    files.append(folder / "log.jsonl")
    if stage in FINAL_CHECKPOINTS:
        files.append(folder / FINAL_CHECKPOINTS[stage])
    return files


def recorded_run(folder: str | os.PathLike) -> tuple[str | None, str] | None:
    """``(command, state)`` of the run ``folder`` holds, or ``None`` when it holds none.

    The command is ``None`` for run files whose command cannot be told (no marker and no ``<name>_config.json``);
    the state is ``"unknown"`` for a folder written before markers existed.
    """
    folder = Path(folder)
    marker = folder / MARKER
    if marker.is_file():
        record = read_json(marker, "run marker")
        if (
            not isinstance(record, dict)
            or record.get("kind") not in RUN_NAMES
            or not isinstance(record.get("state"), str)
        ):
            raise ProCapError(f"run marker {marker} does not name a run kind and state; is it a procap run folder?")
        return record["kind"], record["state"]
    for stage, name in RUN_NAMES.items():
        if (folder / f"{name}_config.json").is_file():
            return stage, "unknown"
    if any((folder / name).exists() for name in _RUN_FILES):
        return None, "unknown"
    return None


def run_inputs(cfg: TrainConfig) -> list[tuple[str, str]]:
    """``(argument, path)`` of every existing file or folder ``cfg`` names for the run to read."""
    named = [("--data", cfg.data), ("--init", cfg.init), ("--vqgan", cfg.vqgan), ("--procedures", cfg.procedures)]
    if cfg.init_encoder and ":" in cfg.init_encoder:
        named.append(("--init-encoder", cfg.init_encoder.split(":", 1)[1]))
    named = [(flag, path) for flag, path in named if not (flag == "--vqgan" and path == UNTRAINED_VQGAN)]
    return [(flag, path) for flag, path in named if path and os.path.exists(path)]


def check_run_folder(cfg: TrainConfig) -> None:
    """Refuse, before any work, a ``cfg.out`` this run may not write: the rules of the module docstring.

    The command line calls this as soon as the options are known and :class:`RunFolder` again when the run
    starts, so the rules hold for every path however it was given (flag, ``--config`` file, Python API).

    Raises:
        ProCapError: one sentence naming ``--out`` and what to do.
    """
    # A torchrun restart continues its own run (its command line has no --resume): not a second run in the folder.
    cfg = resume_after_restart(cfg)
    out = Path(cfg.out)
    note = recover_swap(out)  # a replacement killed between its two renames left the old run beside the folder
    if note:
        logger.warning("procap: note: %s.", note)
    inputs = run_inputs(cfg)
    _check_apart_from_inputs(out, cfg.stage, inputs)
    found = recorded_run(out) if out.is_dir() else None
    if found is not None:
        _check_may_write_over(out, cfg, inputs, *found)


def _check_apart_from_inputs(out: Path, stage: str, inputs: list[tuple[str, str]]) -> None:
    """Neither the folder nor a file the run writes in it is one of the run's ``inputs`` or lies in an input folder."""
    output_apart(out, "--out", inputs)
    # an --init that is best.safetensors of this very folder, named on the command line or in a config file
    refuse_inputs(*run_files(out, stage))
    for written in run_files(out, stage):
        overlap = input_overlap(written, inputs)
        if overlap is not None:
            raise ProCapError(f"the output {written} {overlap}; write the run elsewhere.")


def _check_may_write_over(
    out: Path, cfg: TrainConfig, inputs: list[tuple[str, str]], kind: str | None, state: str
) -> None:
    """A folder holding a run (``kind``, its command, in ``state``) is written only by its own ``--resume``, or by
    ``--overwrite`` when it holds none of the ``inputs``."""
    what = f"a finished `procap {kind}` run" if state == "finished" else f"a `procap {kind}` run"
    if kind is None:
        what = "the files of a procap run whose command it does not record"
    if cfg.resume:
        if kind != cfg.stage:
            raise ProCapError(
                f"--resume: --out {out} holds {what}, not a `procap {cfg.stage}` run to continue; choose the "
                "folder of the run to continue."
            )
        return
    if cfg.overwrite:
        inside = [(flag, path) for flag, path in inputs if out.resolve() in Path(path).resolve().parents]
        if inside:
            flag, path = inside[0]
            raise ProCapError(
                f"--overwrite: --out {out} holds {flag} {path}, which this run reads; replacing the folder would "
                "delete it, so choose another --out."
            )
        return
    raise ProCapError(
        f"--out {out} holds {what}; pass --resume to continue it, --overwrite to replace it, or choose another folder."
        if kind == cfg.stage
        else f"--out {out} holds {what}, which a `procap {cfg.stage}` run may not write into; choose another "
        "folder (or pass --overwrite to replace it)."
    )


class RunFolder:
    """The run folder of one run: its marker, and the folder beside it when the run replaces another.

    Args:
        cfg: the run's options; ``cfg.out`` is the folder the run is known by.

    Attributes:
        final: ``cfg.out``.
        folder: where the run writes: ``final``, or (after :meth:`begin`) a new folder beside it while replacing
            the run in ``final``.
    """

    def __init__(self, cfg: TrainConfig) -> None:
        check_run_folder(cfg)
        self.kind = cfg.stage
        self.final = Path(cfg.out)
        self.replacing = bool(cfg.overwrite and not cfg.resume and self.final.is_dir() and recorded_run(self.final))
        self.folder = self.final

    def begin(self) -> Path:
        """Create the folder beside the old run when replacing it; returns the folder the run writes into.

        Called once the run holds its lock, inside the block that calls :meth:`discard` on failure, so a refused
        or failed start leaves nothing beside the old run.
        """
        if self.replacing and self.folder == self.final:
            prefix = beside(self.final, "replacing-").name
            # under the lock no other run replaces this folder: any such folder is a killed replacement's
            for stale in self.final.parent.glob(glob.escape(prefix) + "*"):
                shutil.rmtree(stale, ignore_errors=True)
            # beside the old run, on its file system, so the swap at the end is two renames
            self.folder = Path(tempfile.mkdtemp(prefix=prefix, dir=self.final.parent))
        return self.folder

    def mark(self, state: str) -> None:
        atomic_write_json(self.folder / MARKER, {"kind": self.kind, "state": state})

    def finish(self) -> None:
        """Mark the run finished and, when replacing, swap it into :attr:`final` and delete the old run."""
        self.mark("finished")
        if not self.replacing:
            return
        swap_folder(self.folder, self.final)  # the old run or the new one is whole at every moment (module docstring)
        self.folder = self.final

    def discard(self) -> None:
        """A replacing run that did not finish: remove its folder; the old run stays as it was."""
        if self.replacing and self.folder != self.final:
            shutil.rmtree(self.folder, ignore_errors=True)
