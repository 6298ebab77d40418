"""Training options: one dataclass for every stage; the CLI maps its flags onto these fields.

Fields left ``None`` take the paper's value for the stage (:data:`STAGE_DEFAULTS`, docs/training.md) when
:meth:`TrainConfig.resolved` is called; small runs override them (``--steps``, ``--lr``, ``--warmup-steps``).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from procap.core import validate
from procap.core.config import LR_DECAYS, PROCEDURE_SOURCES, UNTRAINED_VQGAN
from procap.core.errors import ProCapError
from procap.data.datasets import DATASETS, DEFAULT_DATASET
from procap.eval.metrics import metric_names

if TYPE_CHECKING:
    import torch

# What picks a stage-2 run's best.safetensors on the validation pairs: their CIDEr, or "correctness", the mean of the
# fractions of captions right about the change, its type and the object (procap.eval.correctness; needs each pair's
# truth, which the synthetic benchmark and CLEVR-Change have).
SELECT_METRICS = ("CIDEr", "correctness")

# Paper values per stage. Stage 1: 200k steps, batch 8, AdamW, lr warm-up 1e-6 -> 1e-4 over 5k steps.
# Stage 2: 40 epochs, batch 16, decoder lr warm-up 0 -> 5e-5 over 10%; the encoder lr is the dataset's
# (procap.data.datasets: DatasetSpec.encoder_lr).
STAGE_DEFAULTS: dict[str, dict[str, Any]] = {
    "pretrain": {"steps": 200_000, "batch_size": 8, "lr": 1e-4, "lr_start": 1e-6, "warmup_steps": 5_000},
    "train": {"epochs": 40, "batch_size": 16, "decoder_lr": 5e-5, "warmup_frac": 0.1},
    "vqgan": {"steps": 20_000, "batch_size": 16, "lr": 2e-4, "lr_start": 0.0, "warmup_steps": 500},
}


# Ceilings of the integers that multiply a run's time or memory (docs/errors.md), far above any real run: the
# paper's longest stage is 200,000 steps; each accumulated micro-batch is one more forward and backward pass per step.
MAX_STEPS = 10_000_000
MAX_EPOCHS = 100_000
MAX_GRAD_ACCUM = 1024

# The range of every integer option (keyword arguments of procap.core.validate.number), checked by TrainConfig for the
# Python API and by the command line under the flags' names (procap.commands.cli_args.FLAG_BOUNDS adds the floats).
INTEGER_BOUNDS: dict[str, dict[str, int]] = {
    "steps": {"minimum": 1, "maximum": MAX_STEPS},
    "epochs": {"minimum": 1, "maximum": MAX_EPOCHS},
    "batch_size": {"minimum": 1},  # its ceiling is the device's memory: procap.train.batch_memory
    "grad_accum": {"minimum": 1, "maximum": MAX_GRAD_ACCUM},
    "max_pairs": {"minimum": 1},  # cut to the pairs there are
    "warmup_steps": {"minimum": 0, "maximum": MAX_STEPS},
    "workers": {"minimum": 0, "maximum": validate.MAX_WORKERS},
    "log_every": {"minimum": 1, "maximum": MAX_STEPS},
    "save_every": {"minimum": 0, "maximum": MAX_STEPS},
    "val_every": {"minimum": 0, "maximum": MAX_STEPS},
    "val_pairs": {"minimum": 1},  # cut to the pairs there are
    "num_keyframes": validate.KEYFRAME_BOUNDS,
    "seed": validate.SEED_BOUNDS,
}


# Fields that name files or folders. A run's config file stores them absolute, and a relative one in any config file
# is read against that file's folder (procap.commands.cli_args.read_config_file), so that a replay started from
# another folder reads the same data and writes the same run folder.
PATH_FIELDS = ("data", "out", "init", "vqgan", "procedures", "init_encoder")
NOT_A_PATH = {"procedures": PROCEDURE_SOURCES, "vqgan": (UNTRAINED_VQGAN,)}  # values of a path field that name no file
PATH_PREFIX = {"init_encoder": "clip:"}  # the path follows this prefix


def map_paths(values: dict[str, Any], convert: Callable[[str], str]) -> dict[str, Any]:
    """A copy of the option ``values`` with ``convert`` applied to every path they name (:data:`PATH_FIELDS`)."""
    values = dict(values)
    for field in PATH_FIELDS:
        value = values.get(field)
        if not isinstance(value, str) or not value or value in NOT_A_PATH.get(field, ()):
            continue
        prefix = PATH_PREFIX.get(field, "")
        if prefix and value.startswith(prefix):
            values[field] = prefix + convert(value[len(prefix) :])
        elif not prefix:
            values[field] = convert(value)
    return values


# What ``--resume`` lets a user change (docs/training.md): how long the run trains and how it is run, watched and
# saved. Every other option decides what the run computes (its model, data, optimisation, validation and thus which
# checkpoint is best) and is taken from the run's saved config; a value that contradicts it is refused, since a
# resumed run that validated on 50 pairs instead of 200 rewrote best's recorded score on another subset.
RESUME_CHANGEABLE = frozenset(
    {
        "steps",
        "epochs",
        "device",
        "workers",
        "progress",
        "log_every",
        "save_every",
        "save_minutes",
        "dist_timeout",
        "cache_images",
        "cache_features",
        "loggers",
        "wandb_project",
        "wandb_name",
    }
)
# The run's length is one choice: a run given --epochs on resume no longer takes the saved steps, which would win.
RUN_LENGTH = ("steps", "epochs")
# Keys of a saved config that are no option of the resumed run: where it is (the folder may have moved) and what the
# command was asked to do with it.
NOT_RESUMED = ("out", "resume", "overwrite", "stage")


def comparable(field: str, value: Any) -> Any:
    """``value`` of the option ``field`` in the form two runs' options are compared in: lists as tuples, paths
    absolute, metric names as :func:`procap.eval.metrics.metric_names` spells them."""
    if isinstance(value, list):
        value = tuple(value)
    if field in PATH_FIELDS:
        value = map_paths({field: value}, absolute_path)[field]
    if field == "val_metrics" and value is not None:
        try:
            value = tuple(metric_names(value))
        except ProCapError:
            pass  # an unknown name is refused when the config is built
    return value


def resume_mismatches(config: dict[str, Any], saved: dict[str, Any]) -> list[str]:
    """The fields of a resumed run's full ``config`` (``TrainConfig.replay_dict()``) that differ from the ``saved``
    config of the run it continues and that a resume may not change (a saved key that is no field is skipped)."""
    return [
        field
        for field, value in saved.items()
        if field in config
        and field not in NOT_RESUMED
        and field not in RESUME_CHANGEABLE
        and comparable(field, config[field]) != comparable(field, value)
    ]


def resumed_values(saved: dict[str, Any], given: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The options of a resumed run: ``given`` (what the user repeated) over ``saved`` (the run's config file).

    Returns:
        The merged options, and the fields of ``given`` that contradict ``saved`` without being
        :data:`RESUME_CHANGEABLE` (for the caller to refuse, naming them as it names them).
    """
    values = dict(given)
    length_given = any(given.get(field) is not None for field in RUN_LENGTH)
    for field, value in saved.items():
        if field in NOT_RESUMED or field in values or (length_given and field in RUN_LENGTH):
            continue
        values[field] = value
    conflicts = resume_mismatches(given, saved)
    return values, conflicts


Filled = TypeVar("Filled")


def filled(value: Filled | None, name: str) -> Filled:
    """A hyper-parameter that :meth:`TrainConfig.resolved` fills in (``name`` is its field), as the loops read it.

    Raises:
        ValueError: it is None, so the config reached a training loop without being resolved.
    """
    if value is None:
        raise ValueError(f"TrainConfig.{name} is None: a training stage takes a TrainConfig.resolved() copy")
    return value


def absolute_path(path: str) -> str:
    """``path`` made absolute against the working folder, without resolving symlinks."""
    return os.path.normpath(os.path.abspath(path))


@dataclass
class TrainConfig:
    """Options shared by ``procap vqgan``, ``procap pretrain`` and ``procap train``.

    ``steps`` wins over ``epochs`` when both are given. ``val_every = 0`` validates once per epoch.
    """

    stage: str = "train"
    preset: str = "tiny"
    data: str | None = None
    dataset: str = DEFAULT_DATASET
    out: str = "runs/procap"
    steps: int | None = None
    epochs: int | None = None
    batch_size: int | None = None  # per process; the global batch is batch_size x processes x grad_accum
    grad_accum: int = 1  # micro-batches per optimizer step (reach a large global batch on a small machine)
    # stage-1 masks drawn per item from (seed, epoch, index) instead of per batch from the global RNG; None: only
    # when the step is split (torchrun processes or grad_accum > 1), so a plain run keeps its exact old behaviour
    item_masks: bool | None = None
    lr: float | None = None  # stage 1 / VQGAN peak lr; stage 2: sets both encoder and decoder lr
    lr_start: float | None = None
    warmup_steps: int | None = None
    warmup_frac: float | None = None
    encoder_lr: float | None = None
    decoder_lr: float | None = None
    encoder_warmup: bool = True  # stage 2: warm the encoder's lr with the decoder's (departure; paper: False)
    decay: str = "none"  # after warm-up: none (paper) | cosine | linear
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    device: str = "auto"
    amp: bool = True  # bf16 autocast, CUDA only
    resume: bool = False
    overwrite: bool = False  # replace the run in `out` (trained beside it, swapped in when finished)
    dist_timeout: float = 30.0  # minutes a collective may wait for the other ranks (torchrun) before failing
    seed: int = 0
    workers: int = 0
    init: str | None = None  # stage 2: stage-1 checkpoint; stage 1: optional checkpoint to continue from
    init_encoder: str | None = None  # stage 1: "clip:PATH", CLIP ViT blocks into a new encoder
    # VQGAN weights (procap vqgan output) loaded into the frozen tokenizer of a new model; None or "untrained": the
    # preset's random one (the command line fills in the package's tokenizer where it fits the preset, else refuses)
    vqgan: str | None = None
    procedures: str = "crossfade"  # stage 1 frame source: crossfade (stand-in) or an HDF5 procedure cache
    num_keyframes: int | None = None
    max_pairs: int | None = None  # use only the first N training pairs (smoke runs)
    val_every: int = 0
    val_pairs: int | None = 200
    val_metrics: tuple[str, ...] = ("BLEU-4", "ROUGE-L", "CIDEr")  # no METEOR: it needs Java and is slow
    select_metric: str = "CIDEr"  # SELECT_METRICS: what picks stage 2's best.safetensors
    # Stage 2: training pairs added that show one training image twice, as a share of the split, captioned with the
    # split's no-change captions (procap.train.datasets.identical_training_pairs); 0, the paper's, adds none
    identical_pairs: float = 0.0
    save_every: int = 0  # steps between saves of `last` (0: off)
    save_minutes: float = 5.0  # also save `last` when this many minutes passed since the last save (0: off)
    log_every: int = 10
    progress: bool = True
    cache_images: bool = True
    cache_features: bool = False  # memo the frozen VQGAN per image (small datasets; VQGAN.memoize)
    loggers: tuple[str, ...] = ()  # run trackers besides log.jsonl: "tensorboard", "wandb" (procap/train/tracking.py)
    # The wandb run's project and name; None leaves them to WANDB_PROJECT / WANDB_NAME, then "procap" and the stage.
    wandb_project: str | None = None
    wandb_name: str | None = None

    def __post_init__(self) -> None:
        if self.stage not in STAGE_DEFAULTS:
            raise ValueError(f"stage must be one of {sorted(STAGE_DEFAULTS)}, got {self.stage!r}")
        if self.dataset not in DATASETS:
            raise ValueError(f"dataset must be one of {sorted(DATASETS)}, got {self.dataset!r}")
        if self.select_metric not in SELECT_METRICS:
            raise ValueError(f"select_metric must be one of {', '.join(SELECT_METRICS)}, got {self.select_metric!r}")
        if self.decay not in LR_DECAYS:
            raise ValueError(f"decay must be one of {', '.join(LR_DECAYS)}, got {self.decay!r}")
        for name, bounds in INTEGER_BOUNDS.items():  # before any work, for the API as for the command line
            value = getattr(self, name)
            if value is not None:
                validate.integer(value, name, **bounds)
        validate.number(self.identical_pairs, "identical_pairs", minimum=0, maximum=1)
        if self.dist_timeout <= 0:
            raise ValueError(f"dist_timeout must be positive, got {self.dist_timeout}")
        self.loggers = tuple(self.loggers or ())
        unknown = sorted(set(self.loggers) - {"tensorboard", "wandb"})
        if unknown:
            raise ValueError(f"loggers must be tensorboard and/or wandb, got {', '.join(unknown)}")
        try:
            self.val_metrics = tuple(metric_names(self.val_metrics))
        except ProCapError as exc:
            raise ValueError(str(exc)) from None

    def resolved(self) -> TrainConfig:
        """A copy with every ``None`` hyper-parameter filled from the stage's paper defaults."""
        values = dataclasses.asdict(self)
        defaults = dict(STAGE_DEFAULTS[self.stage])
        if self.stage == "train":
            defaults["encoder_lr"] = DATASETS[self.dataset].encoder_lr
        if self.stage == "train" and self.lr is not None:
            defaults.update(encoder_lr=self.lr, decoder_lr=self.lr)
        for key, value in defaults.items():
            if values.get(key) is None and not (key == "epochs" and values.get("steps") is not None):
                values[key] = value
        return TrainConfig(**values)

    def optional_packages(self) -> dict[str, str]:
        """The packages of optional extras this run will import, each with what needs it (checked up front with
        :func:`procap.core.extras.require_all`: a run without them would stop at its first validation)."""
        needs = {}
        if self.stage == "train":
            needs["pycocoevalcap"] = "the validation scores"
        if self.stage == "pretrain" and self.procedures not in PROCEDURE_SOURCES:
            needs["h5py"] = f"the procedure cache {self.procedures}"
        if "tensorboard" in self.loggers:
            needs["tensorboard"] = "--logger tensorboard"
        if "wandb" in self.loggers:
            needs["wandb"] = "--logger wandb"
        return needs

    def replay_dict(self) -> dict[str, Any]:
        """The options as a run's config file stores them, to be replayed with ``--config``: every path absolute,
        ``resume`` and ``overwrite`` false (a replay is a new run, into a folder that holds none; ``--resume`` or
        ``--overwrite`` on the command line says otherwise)."""
        return map_paths(self.to_dict(), absolute_path) | {"resume": False, "overwrite": False}

    def torch_device(self) -> torch.device:
        import torch  # here, not at the top: the command line builds its parsers from this module without torch

        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_args(cls, stage: str, args: Any) -> TrainConfig:
        """Build from an argparse namespace: every attribute whose name is a field is copied."""
        names = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in vars(args).items() if k in names and v is not None}
        values["stage"] = stage
        return cls(**values)
