"""argparse flags shared by ``procap vqgan``, ``procap pretrain`` and ``procap train``; they map onto TrainConfig.

Every flag defaults to ``None`` so that :meth:`TrainConfig.resolved` can fill in the paper's value for the stage.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from procap.core.config import LR_DECAYS, PRESETS, PROCEDURE_SOURCES, UNTRAINED_VQGAN
from procap.core.errors import ProCapError, shown
from procap.data.datasets import DATASETS, DEFAULT_DATASET
from procap.train.config import INTEGER_BOUNDS, SELECT_METRICS, STAGE_DEFAULTS, TrainConfig, map_paths

logger = logging.getLogger(__name__)


def add_common_arguments(parser: argparse.ArgumentParser, stage: str) -> None:
    """Flags for one training stage (``vqgan``, ``pretrain`` or ``train``)."""
    _add_data_arguments(parser, stage)
    optimisation = _add_optimisation_arguments(parser, stage)
    _add_model_arguments(parser, stage, optimisation)


def _add_data_arguments(parser: argparse.ArgumentParser, stage: str) -> None:
    """The "data and output" group: what a run reads and where it writes."""
    g = parser.add_argument_group("data and output")
    g.add_argument(
        "--config",
        metavar="FILE",
        help="re-run a run's resolved config (<out>/<stage>_config.json, or a YAML / JSON file of the same keys); "
        "flags given on the command line override the file",
    )
    g.add_argument("--data", help="dataset root folder")
    g.add_argument(
        "--dataset",
        choices=sorted(DATASETS),
        help=f"dataset format (default {DEFAULT_DATASET})",
    )
    g.add_argument("--out", help="run folder for checkpoints, the log and the resolved config (required)")
    g.add_argument(
        "--preset",
        help=f"model preset: {', '.join(sorted(PRESETS))} (default: the paper's preset of --dataset; tiny for a "
        "small CPU run)" + ("; with --init the checkpoint's model is trained" if stage != "vqgan" else ""),
    )
    g.add_argument("--max-pairs", type=int, help="use only the first N training pairs (default: all)")
    g.add_argument("--workers", type=int, help="DataLoader worker processes (default 0)")
    g.add_argument(
        "--cache",
        dest="cache_images",
        action=argparse.BooleanOptionalAction,
        help="keep decoded images in memory (default on; --no-cache for large datasets)",
    )
    g.add_argument(
        "--cache-features",
        action=argparse.BooleanOptionalAction,
        help="keep frozen-VQGAN features of every training image in memory (small datasets, CPU; default off)",
    )


def _add_optimisation_arguments(parser: argparse.ArgumentParser, stage: str) -> argparse._ArgumentGroup:
    """The "optimisation" group (steps, lr, saving, tracking); returned so that ``train`` adds its lr flags to it."""
    group = parser.add_argument_group("optimisation")
    _add_length_arguments(group, stage)
    _add_learning_rate_arguments(group, stage)
    _add_run_control_arguments(group)
    _add_tracking_arguments(group)
    if stage == "pretrain":
        _add_stage1_optimisation_arguments(group)
    return group


def _add_length_arguments(group: argparse._ArgumentGroup, stage: str) -> None:
    """How long a run trains and on how large a batch."""
    defaults = STAGE_DEFAULTS[stage]
    group.add_argument(
        "--steps",
        type=int,
        help="optimisation steps (wins over --epochs"
        + (f"; default {defaults['steps']:,}" if "steps" in defaults else "")
        + ")",
    )
    group.add_argument(
        "--epochs",
        type=int,
        help="epochs over the training pairs" + (f" (default {defaults['epochs']})" if "epochs" in defaults else ""),
    )
    group.add_argument(
        "--batch-size",
        type=int,
        help=f"batch size per process (default {defaults['batch_size']}"
        + (", the paper's global batch" if stage != "vqgan" else "")
        + "); the global batch is batch size x processes (torchrun) x --grad-accum and is logged at the start",
    )
    group.add_argument("--grad-accum", type=int, help="micro-batches accumulated per optimizer step (default 1)")


def _add_learning_rate_arguments(group: argparse._ArgumentGroup, stage: str) -> None:
    """The learning rate, its schedule and what bounds each step (``train``'s own lr flags come with the model's)."""
    defaults = STAGE_DEFAULTS[stage]
    group.add_argument(
        "--lr",
        type=float,
        help="peak learning rate of both the encoder and the decoder (default: --encoder-lr and --decoder-lr)"
        if stage == "train"
        else f"peak learning rate (default {defaults['lr']:g})",
    )
    if stage != "train":  # stage 2 warms up over --warmup-frac of its steps instead
        group.add_argument(
            "--warmup-steps", type=int, help=f"linear warm-up steps (default {defaults['warmup_steps']:,})"
        )
    group.add_argument("--decay", choices=LR_DECAYS, help="lr after warm-up (default none, as in the paper)")
    group.add_argument("--grad-clip", type=float, help="max gradient norm (default 1.0; 0 disables)")
    group.add_argument("--weight-decay", type=float, help="AdamW weight decay (default 0.01)")


def _add_run_control_arguments(group: argparse._ArgumentGroup) -> None:
    """Where and how a run goes: seed, device, precision, resuming or replacing, logging, saving, torchrun."""
    group.add_argument("--seed", type=int, help="random seed (default 0)")
    group.add_argument("--device", help="cpu, cuda, cuda:1 ... (default: cuda when available)")
    group.add_argument(
        "--amp", action=argparse.BooleanOptionalAction, help="bf16 autocast on CUDA (default on; --no-amp: float32)"
    )
    group.add_argument(
        "--resume",
        action=argparse.BooleanOptionalAction,
        help="continue from <out>/last.safetensors (default off; a run's config file always replays as a new run)",
    )
    group.add_argument(
        "--overwrite",
        action=argparse.BooleanOptionalAction,
        help="replace the run already in --out (the new run is trained beside it and takes its place when it "
        "finishes; without --overwrite or --resume a folder holding a run is refused)",
    )
    group.add_argument(
        "--log-every", type=int, help="log every N steps (default 10; runs under 20 x N steps log more often)"
    )
    group.add_argument("--save-every", type=int, help="also save last checkpoint + state every N steps (default: off)")
    group.add_argument(
        "--save-minutes",
        type=float,
        help="save last checkpoint + state when this many minutes passed since the last save (default 5; "
        "0: off). Ctrl-C and SIGTERM also save before stopping",
    )
    group.add_argument(
        "--dist-timeout",
        type=float,
        help="minutes a process waits for the others under torchrun before the job fails (default 30)",
    )
    group.add_argument("--progress", action=argparse.BooleanOptionalAction, help="show progress bars (default on)")


def _add_tracking_arguments(group: argparse._ArgumentGroup) -> None:
    """Experiment trackers beside log.jsonl."""
    group.add_argument(
        "--logger",
        dest="loggers",
        action="append",
        choices=("tensorboard", "wandb"),
        help="also track the run with TensorBoard (<out>/tensorboard) or Weights & Biases (WANDB_MODE=offline "
        "works without an account); repeat for both. log.jsonl is always written",
    )
    group.add_argument(
        "--wandb-project",
        metavar="NAME",
        help="the Weights & Biases project of --logger wandb (default: WANDB_PROJECT, else procap)",
    )
    group.add_argument(
        "--wandb-name",
        metavar="NAME",
        help="the Weights & Biases run name of --logger wandb (default: WANDB_NAME, else the stage: vqgan, stage1, "
        "stage2)",
    )


def _add_stage1_optimisation_arguments(group: argparse._ArgumentGroup) -> None:
    """``pretrain``'s warm-up start and its per-item MSM masks."""
    group.add_argument(
        "--lr-start",
        type=float,
        help=f"warm-up start lr (default {STAGE_DEFAULTS['pretrain']['lr_start']:g}, the paper's)",
    )
    group.add_argument(
        "--item-masks",
        action=argparse.BooleanOptionalAction,
        help="draw MSM masks per item from (seed, epoch, index) even in a plain run (automatic under torchrun "
        "or --grad-accum > 1), so it matches a split run with the same global batch",
    )


def _add_model_arguments(parser: argparse.ArgumentParser, stage: str, optimisation: argparse._ArgumentGroup) -> None:
    """The "model" group of ``pretrain`` and ``train``, and ``train``'s lr flags and "validation" group."""
    if stage not in ("pretrain", "train"):
        return
    group = parser.add_argument_group("model")
    group.add_argument(
        "--vqgan",
        metavar="FILE",
        help="frozen VQGAN tokenizer of a new model: weights from `procap vqgan`, or 'untrained' for the preset's "
        "random one (smoke runs only). Default: the tokenizer shipped in the package where it fits the preset "
        "(tiny, 64 px synthetic scenes); other presets need it. Not used with --init, whose checkpoint carries "
        "its tokenizer",
    )
    add_keyframes_argument(
        group,
        "k, the keyframes (procedure queries) per pair (default: the preset's, 2; with --init the checkpoint's)"
        + ("; 0 gives the static-pair baseline" if stage == "train" else ""),
    )
    if stage == "pretrain":
        _add_stage1_model_arguments(group)
    else:
        group.add_argument(
            "--init",
            help="stage-1 checkpoint to start from (`procap pretrain`'s stage1.safetensors), its model and tokenizer. "
            "Without it a new model is trained from scratch with the preset's k = 2 procedure queries (ProCap "
            "without stage 1); add --num-keyframes 0 for the static-pair baseline",
        )
        _add_stage2_learning_rate_arguments(optimisation)
        _add_validation_arguments(parser)


def _add_stage1_model_arguments(group: argparse._ArgumentGroup) -> None:
    """Where ``pretrain``'s model starts from and which frames it learns the procedures from."""
    group.add_argument("--init", help="continue from an earlier stage-1 checkpoint (its model and tokenizer)")
    group.add_argument(
        "--init-encoder",
        metavar="clip:PATH",
        help="start the encoder blocks from a CLIP ViT checkpoint (OpenAI TorchScript .pt, open_clip or "
        "Hugging Face safetensors; read without running its code), as the authors' code does",
    )
    group.add_argument(
        "--procedures",
        help="stage-1 frames: 'crossfade' (stand-in; the default), 'truth' (the exact intermediate frames of a "
        "`procap synth` benchmark in --data) or a procedure cache path",
    )


def _add_stage2_learning_rate_arguments(optimisation: argparse._ArgumentGroup) -> None:
    """``train``'s encoder and decoder learning rates, its warm-up and its identical pairs (in "optimisation")."""
    optimisation.add_argument("--encoder-lr", type=float, help="encoder lr (default: the dataset's paper value)")
    optimisation.add_argument(
        "--decoder-lr",
        type=float,
        help=f"decoder peak lr after warm-up (default {STAGE_DEFAULTS['train']['decoder_lr']:g}, the paper's)",
    )
    optimisation.add_argument(
        "--warmup-frac",
        type=float,
        help=f"decoder warm-up fraction of all steps (default {STAGE_DEFAULTS['train']['warmup_frac']:g}, the paper's)",
    )
    optimisation.add_argument(
        "--encoder-warmup",
        action=argparse.BooleanOptionalAction,
        help="warm the encoder lr up with the decoder's, which stops the memory from collapsing (default on; "
        "docs/model.md); --no-encoder-warmup keeps it constant from step 0, as the paper does",
    )
    optimisation.add_argument(
        "--identical-pairs",
        type=float,
        metavar="SHARE",
        help="add this share of training pairs that show one training image twice, captioned with the "
        "split's no-change captions, so that the same image twice is said to be no change (default 0, the "
        "paper's: none; needs no-change pairs in the split)",
    )


def _add_validation_arguments(parser: argparse.ArgumentParser) -> None:
    """``train``'s "validation" group: how often, on how many pairs, and what picks the best checkpoint."""
    group = parser.add_argument_group("validation")
    group.add_argument("--val-every", type=int, help="validate every N steps (default: every epoch)")
    group.add_argument("--val-pairs", type=int, help="validation pairs used (default 200)")
    group.add_argument(
        "--select",
        dest="select_metric",
        choices=SELECT_METRICS,
        help="what picks best.safetensors: validation CIDEr (default) or correctness, the mean of the change, "
        "type and object accuracies of the captions (needs the pairs' truths: CLEVR-Change and the synthetic "
        "benchmark)",
    )


def add_keyframes_argument(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup, help: str, default: int | None = None
) -> None:
    """k, the keyframes per pair, spelled one way wherever a command takes it: ``-k`` / ``--num-keyframes`` into
    ``args.num_keyframes``, as the config key and the API argument are named. ``--keyframes`` (``procap procedure``'s
    earlier spelling) is still read, without a line in the help, so scripts written for it keep working."""
    parser.add_argument("-k", "--num-keyframes", type=int, default=default, metavar="K", help=help)
    parser.add_argument(
        "--keyframes", dest="num_keyframes", type=int, default=argparse.SUPPRESS, help=argparse.SUPPRESS
    )


# Keys of <out>/<stage>_config.json that record facts of the run rather than options.
RUN_FACTS = ("data_parallel",)

# Allowed ranges of the numeric flags (keyword arguments of procap.core.validate.number); absent flags are not checked.
FLAG_BOUNDS: dict[str, Mapping[str, float]] = {
    **INTEGER_BOUNDS,  # the integers' ranges are TrainConfig's (steps, epochs, --grad-accum, ... with their ceilings)
    "dist_timeout": {"above": 0},
    "lr": {"above": 0},
    "lr_start": {"minimum": 0},
    "encoder_lr": {"minimum": 0},
    "decoder_lr": {"above": 0},
    "warmup_frac": {"minimum": 0, "maximum": 1},
    "grad_clip": {"minimum": 0},
    "weight_decay": {"minimum": 0},
    "save_minutes": {"minimum": 0},
    "identical_pairs": {"minimum": 0, "maximum": 1},
}


def check_args(args: argparse.Namespace) -> None:
    """Every flag in range and every path usable, before anything is loaded or written."""
    from procap.core import validate

    if args.preset not in PRESETS:
        raise ProCapError(f"unknown preset {args.preset!r}; choose one of: {', '.join(sorted(PRESETS))}")
    for name, bounds in FLAG_BOUNDS.items():
        validate.number(getattr(args, name, None), f"--{name.replace('_', '-')}", **bounds)
    if getattr(args, "data", None) is None:
        raise ProCapError("--data is required: the dataset root folder")
    validate.input_dir(args.data, "--data")
    if getattr(args, "init_encoder", None):
        from procap.convert.clip import parse_init_encoder

        parse_init_encoder(args.init_encoder)  # a bad value fails before any data is read
    validate.output_dir(args.out, "--out")
    if getattr(args, "resume", None) and getattr(args, "overwrite", None):
        raise ProCapError("give either --resume (continue the run in --out) or --overwrite (replace it), not both.")
    if getattr(args, "resume", None) and not (Path(args.out) / "last.safetensors").is_file():
        raise ProCapError(f"--resume: {args.out} holds no last.safetensors to continue from.")
    for flag in ("init", "vqgan"):
        if getattr(args, flag, None) and not (flag == "vqgan" and args.vqgan == UNTRAINED_VQGAN):
            validate.input_file(getattr(args, flag), f"--{flag}")
    procedures = getattr(args, "procedures", None)
    if procedures and procedures not in PROCEDURE_SOURCES and not Path(procedures).exists():
        raise ProCapError(
            f"--procedures {procedures} is neither one of {', '.join(PROCEDURE_SOURCES)} nor an existing procedure "
            "cache."
        )
    if procedures == "truth" and not (Path(args.data) / "scenes.json").is_file():
        raise ProCapError(
            f"--procedures truth renders the frames of a benchmark written by `procap synth`, and --data {args.data} "
            "holds no scenes.json."
        )


def check_init_preset(init: str, preset: str) -> None:
    """A run from ``--init`` trains the checkpoint's model: a ``--preset`` naming another model was ignored with
    exit 0 (``train --init tiny.safetensors --preset clevr`` trained the tiny model)."""
    from procap.train.batch_memory import checkpoint_config

    config = checkpoint_config(init)
    if config is not None and config.name != preset:
        raise ProCapError(
            f"--preset {preset} differs from the {config.name} model of --init {init}, which the run trains; "
            "leave out --preset."
        )


# TrainConfig fields naming files or folders; in a config file a relative one is relative to the file's folder.
CONFIG_PATHS = ("data", "out", "init", "vqgan", "procedures", "init_encoder")


def read_config_file(path: str | Path, stage: str) -> dict[str, Any]:
    """The TrainConfig fields stored in a run's config file (JSON, or YAML with the ``[train]`` extra).

    A relative path in the file (``data``, ``out``, ``init``, ...) is taken relative to the file's folder, so a
    replay from another working folder reads the same dataset and writes the same run folder.

    Raises:
        ProCapError: unreadable file, a key given twice, not a mapping, another stage's config, or keys that are
            no TrainConfig field.
    """
    from procap.core import validate
    from procap.core.json_files import parse_json, parse_yaml, read_bytes

    path = validate.input_file(path, "--config file")
    source = f"--config file {path}"
    text = read_bytes(path, "--config file")  # refused from its size when too large to be a config
    if path.suffix.lower() in (".yaml", ".yml"):
        data = parse_yaml(text, source)  # bytes: text that is not UTF-8 is refused, never altered
    else:
        data = parse_json(text, source)
    if not isinstance(data, dict):
        raise ProCapError(f"--config file {path} does not hold a mapping of option names to values.")
    data = {k: v for k, v in data.items() if k not in RUN_FACTS}
    # a relative path in a config file names a place beside the file, wherever the command runs from
    data = map_paths(data, lambda value: os.path.normpath(os.path.join(path.parent.absolute(), value)))
    if data.get("stage", stage) != stage:
        raise ProCapError(f"--config file {path} is a `procap {data['stage']}` config, not `procap {stage}`.")
    data.pop("stage", None)
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    unknown = sorted(set(data) - fields)
    if unknown:
        raise ProCapError(f"--config file {path} has keys that are no training option: {', '.join(unknown[:5])}.")
    types = {f.name: str(f.type) for f in dataclasses.fields(TrainConfig)}
    for key, value in data.items():
        wanted = _config_value_kind(types[key], value)
        if wanted is not None:
            raise ProCapError(f"--config file {path}: {key} must be {wanted}, got {shown(value)}.")
    for key in CONFIG_PATHS:
        if isinstance(data.get(key), str):
            data[key] = _relative_to_config(data[key], path.parent, key)
    return data


def _relative_to_config(value: str, folder: Path, key: str) -> str:
    """``value`` of the config key ``key`` with a relative path joined to the config file's ``folder``."""
    if key == "procedures" and value in PROCEDURE_SOURCES:  # a source's name, not a cache folder
        return value
    if key == "vqgan" and value == UNTRAINED_VQGAN:
        return value
    prefix, sep, rest = value.partition(":") if key == "init_encoder" else ("", "", value)
    if not rest or os.path.isabs(os.path.expanduser(rest)):
        return value
    return f"{prefix}{sep}{os.path.join(folder, rest)}"


def _config_value_kind(annotation: str, value: Any) -> str | None:
    """None when ``value`` fits a TrainConfig field annotated ``annotation``, else what the field takes (a file's
    ``steps: "ten"`` or ``data: 5`` reached the checks as a string or a number and ended in a traceback)."""
    if value is None:
        return None if "None" in annotation else "given"
    if annotation.startswith("tuple"):
        ok = isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value)
        return None if ok else "a list of names"
    if annotation.startswith("bool"):
        return None if isinstance(value, bool) else "true or false"
    if isinstance(value, bool):  # a YAML true is no number
        return "a number" if annotation.startswith(("int", "float")) else "text"
    if annotation.startswith("int"):
        return None if isinstance(value, int) else "an integer"
    if annotation.startswith("float"):
        return None if isinstance(value, (int, float)) else "a number"
    if annotation.startswith("str"):
        return None if isinstance(value, str) else "text"
    return None


def config_from_args(stage: str, args: argparse.Namespace, notes: list[str] | None = None) -> TrainConfig:
    """TrainConfig from parsed flags over an optional ``--config`` file, with one-sentence errors for bad values.

    Without ``--preset`` a run that builds a new model uses its dataset's paper preset and says so; without
    ``--vqgan`` it names the shipped tokenizer. These notes go to stderr now, or into ``notes`` when a list is given
    (the training commands print them only once the data has been read: bad data is then one sentence alone).
    """
    given_preset = getattr(args, "preset", None)  # on the command line, before a --config file fills it in
    if getattr(args, "config", None):
        for key, value in read_config_file(args.config, stage).items():
            if getattr(args, key, None) is None:  # a flag given on the command line wins
                setattr(args, key, tuple(value) if isinstance(value, list) else value)
    resume_note = None
    if getattr(args, "resume", None) and getattr(args, "out", None) is not None:
        resume_note = take_saved_options(stage, args)
    if getattr(args, "dataset", None) is None:
        args.dataset = DEFAULT_DATASET
    if getattr(args, "out", None) is None:
        raise ProCapError("--out is required: the run folder (or a --config file that names one)")
    note = None
    if getattr(args, "preset", None) is None:
        args.preset = DATASETS[args.dataset].paper_preset
        if not (stage == "train" and getattr(args, "init", None)):  # with --init the checkpoint's model is used
            note = (
                f"procap {stage}: no --preset given: using '{args.preset}', the paper's preset for {args.dataset} "
                "(--preset tiny for a small CPU run)"
            )
    check_args(args)
    try:
        config = TrainConfig.from_args(stage, args)
    except (ValueError, TypeError) as exc:
        raise ProCapError(str(exc)) from None
    from procap.core.extras import require_all

    require_all(config.optional_packages(), f"procap {stage}")  # a missing extra fails now, not at a validation
    if stage == "train":
        from procap.eval.metrics import require_java

        require_java(config.val_metrics, "of the config file's val_metrics")
    # The checks above need no torch; the device's imports it, and so do those below (they read weight files).
    if getattr(args, "device", None):
        from procap.core import validate

        validate.device(args.device)
    if given_preset and stage != "vqgan" and getattr(args, "init", None):
        check_init_preset(args.init, given_preset)
    from procap.train.batch_memory import check_training_batch

    tokenizer_note = default_tokenizer(stage, args)  # after the cheap checks: it reads the shipped file's header
    if getattr(args, "vqgan", None) != config.vqgan:
        config = dataclasses.replace(config, vqgan=args.vqgan)

    from procap.train.run_folder import check_run_folder

    check_run_folder(config)  # --out from the command line or a --config file: the same rules, before any work
    check_training_batch(config)  # a batch that cannot fit is refused before any data is read
    found = [line for line in (note, tokenizer_note, resume_note) if line]
    if notes is None:
        print_notes(found)
    else:
        notes.extend(found)
    return config


# The flags of the options whose flag is not --<field> spelled with dashes.
FLAG_OF_FIELD = {"select_metric": "--select", "loggers": "--logger", "cache_images": "--cache"}


def take_saved_options(stage: str, args: argparse.Namespace) -> str | None:
    """Fill every option ``args`` leaves out from the config file of the run ``--resume`` continues, and refuse a
    given one that contradicts it (:func:`procap.train.config.resumed_values`; the changeable options are
    :data:`procap.train.config.RESUME_CHANGEABLE`). A resume took the defaults instead: without ``--val-pairs`` it
    validated on 200 pairs where the run had used 50, and rewrote best's recorded score on another subset.

    Returns:
        A note when the run folder holds a checkpoint but not its config file (an older run, or a file deleted by
        hand): the run is then resumed from the options given, as before.

    Raises:
        ProCapError: a given option differs from the run's, naming the flag, both values and the config file.
    """
    from procap.train.config import resumed_values
    from procap.train.run_folder import RUN_NAMES

    path = Path(args.out) / f"{RUN_NAMES[stage]}_config.json"
    if not path.is_file():
        if not (Path(args.out) / "last.safetensors").is_file():
            return None  # nothing to resume: the checks that follow say so
        return f"procap {stage}: --resume: {path} is missing, so the run continues with the options given"
    saved = read_config_file(path, stage)
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    given = {name: getattr(args, name) for name in fields if getattr(args, name, None) is not None}
    values, conflicts = resumed_values(saved, given)
    if conflicts:
        field = conflicts[0]
        flag = FLAG_OF_FIELD.get(field, f"--{field.replace('_', '-')}")
        raise ProCapError(
            f"--resume: {flag} {shown(given[field])} differs from the {shown(saved[field])} the run in {args.out} "
            f"was trained with ({path.name}); leave {flag} out to continue the run as it was, or start a new run "
            "(--overwrite or another --out)."
        )
    for name, value in values.items():
        setattr(args, name, tuple(value) if isinstance(value, list) else value)
    return None


def print_notes(notes: list[str]) -> None:
    """Log the notes :func:`config_from_args` collected (on stderr, from the command line), one a line."""
    for line in notes:
        logger.info(line)


def default_tokenizer(stage: str, args: argparse.Namespace) -> str | None:
    """Fill in ``--vqgan`` for a run that builds a new model without one: the tokenizer shipped in the package when
    it fits the preset (returns the line that says so), else a refusal naming ``--vqgan``.

    A new model's tokenizer used to be the preset's untrained one, without a word: a run then trained on random
    features. ``--vqgan untrained`` still asks for that by name; a run from ``--init`` keeps the checkpoint's.

    Raises:
        ProCapError: no ``--vqgan`` for a preset the shipped tokenizer does not fit.
    """
    if stage == "vqgan" or getattr(args, "vqgan", None) or getattr(args, "init", None):
        return None
    from procap.assets import demo_tokenizer_path
    from procap.model.vqgan import VQGAN

    shipped = demo_tokenizer_path()
    if VQGAN.read_config(shipped) != PRESETS[args.preset].vqgan:
        raise ProCapError(
            f"--vqgan is required with the {args.preset} preset: the package ships a tokenizer for the tiny preset "
            f"only; train one with `procap vqgan --preset {args.preset} ...` and pass its vqgan.safetensors, or pass "
            f"--vqgan {UNTRAINED_VQGAN} to train on a random tokenizer (smoke runs)."
        )
    args.vqgan = str(shipped)
    return (
        f"procap {stage}: no --vqgan given: using the tokenizer shipped in the package ({shipped.name}, fitted on "
        f"the 64 px synthetic benchmark; --vqgan FILE for your own, --vqgan {UNTRAINED_VQGAN} for a random one)"
    )
