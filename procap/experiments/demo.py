"""``procap demo``: the whole pipeline on the embedded synthetic benchmark, the paper's 2 x 2 ablation over seeds.

Steps: generate the synthetic CLEVR-format benchmark (64 px), fit a small VQGAN (the ``tiny`` preset's), build
stage-1 procedures, then for every training seed run stage 1 once and train the four cells of stage 1 x procedure
queries:

- ``ProCap (k=2)``: stage 1 (explicit procedure modeling) followed by stage 2;
- ``ProCap, no stage 1 (k=2)``: the same model and stage 2 from a random encoder, isolating what stage 1 adds;
- ``stage 1, static pair (k=0)``: stage 2 from the same stage-1 encoder without procedure queries
  (:func:`procap.model.procap.without_procedure_queries`), isolating what the queries add to stage 1;
- ``static pair (k=0)``: no procedure queries and no stage 1.

The paper's claim is an interaction: on CLEVR-Change it reports CIDEr 108.4 (neither), 112.7 and 106.2 (one of the
two) and 128.5 (both). Budgets are equal in optimisation steps: the two models without stage 1 get the stage-1
steps as extra stage-2 steps. Each model is evaluated on the test split with BLEU-4 / METEOR / ROUGE-L / CIDEr and with caption
correctness (:mod:`procap.eval.correctness`: change detected, type, object, new value, distinct captions); with
several seeds ``metrics.json`` holds each seed's figures and their mean and standard deviation. Last,
:func:`procap.experiments.report.build_report` writes ``report.html``: tables, training curves and examples with the imagined
procedure, in one self-contained file.

The benchmark, the VQGAN and the procedures are built once (from ``--seed``); the seeds vary model
initialisation and batch order. Budgets depart from the paper where a CPU run needs it (docs/training.md).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import logging
import os
import queue as queue_module
import shutil
import signal
import statistics
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from typing_extensions import Self

from procap.core import validate
from procap.core.config import DEMO_MAX_SEEDS, DEMO_MODELS, DEMO_PROCEDURES, PROCEDURE_SOURCES
from procap.core.errors import ProCapError
from procap.core.json_files import read_json, read_json_lines
from procap.core.logs import LOGGER_NAME, TO_STDOUT, start_console_logging
from procap.data.images import ImageCache
from procap.train.config import TrainConfig

if TYPE_CHECKING:
    from procap.data.vocab import Vocabulary

PRESET = "tiny"
# The models and the seed ceiling live with the named choices, so that `procap demo` checks --jobs and --seeds
# before torch is imported.
MAX_SEEDS = DEMO_MAX_SEEDS
IMAGE_SIZE = 64
# The demo's table keeps four caption metrics beside the correctness columns; `procap evaluate` reports every metric.
DEMO_METRICS = ("BLEU-4", "METEOR", "ROUGE-L", "CIDEr")
# The weights of stage 1's losses, which a resumed seed must share with today's preset (_check_departures)
STAGE1_WEIGHTS = ("msm_weight", "align_weight", "csy_weight")
MODELS = DEMO_MODELS  # (run folder, label)
# correctness figures averaged over seeds (procap.eval.correctness.caption_accuracy), the failure kinds included
ACCURACY_KEYS = (
    "change",
    "type",
    "object",
    "new_value",
    "distinct",
    "miss_rate",
    "false_positive_rate",
    "move_as_add_drop",
    "unparsed_changes",
    "identical_change_rate",  # every test image shown twice, captioned with a change (evaluate_run)
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DemoBudget:
    """Sizes and schedules of one demo run."""

    scenes: int
    vqgan_steps: int
    vqgan_batch: int
    stage1_steps: int
    stage1_batch: int
    stage2_steps: int
    stage2_batch: int
    vqgan_lr: float = 1e-3
    stage1_lr: float = 5e-4
    stage2_lr: float = 1e-3
    val_every: int = 0
    val_pairs: int = 100
    max_test_pairs: int | None = None
    stage1_pairs: int | None = None  # stage 1 pre-trains on the procedures of the first N training pairs
    # Encoder lr of the stage-2 runs that start from stage 1 (None: stage2_lr): below the new decoder's, so that
    # fine-tuning keeps what stage 1 learned (stage2_lr is 20x the paper's 5e-5, for many times stage 1's steps).
    # The runs from a random encoder train it at stage2_lr.
    stage2_encoder_lr: float | None = None
    # The benchmark's view change within a pair when the caller names none (procap.core.config.VIEWPOINTS)
    viewpoint: str = "none"
    # What picks each stage-2 run's best checkpoint (TrainConfig.select_metric): the captions' correctness on the
    # validation pairs, the figures the demo reports; CIDEr on 100 pairs picked checkpoints 23 points of object
    # below the run's last one (docs/training.md)
    select_metric: str = "correctness"
    # Stage 2's added pairs of one training image twice, as a share of the training pairs
    # (TrainConfig.identical_pairs): the quick budget's models otherwise called 10-20 % of identical pairs a change
    identical_pairs: float = 0.0


QUICK = DemoBudget(
    scenes=800,
    vqgan_steps=100,  # with --train-tokenizer only: the embedded tokenizer is used otherwise
    vqgan_batch=16,
    stage1_steps=10,
    stage1_batch=8,
    stage2_steps=600,
    stage2_batch=32,
    stage2_lr=1e-3,
    val_every=300,
    val_pairs=40,
    max_test_pairs=60,
    stage1_pairs=24,
    identical_pairs=0.2,
    # stage2_encoder_lr stays the decoder's: 10 stage-1 steps leave a nearly random encoder, which a lower lr would
    # only slow (the CI bounds of tests/test_demo.py were measured so)
    # viewpoint stays none: at 600 stage-2 steps every model is near chance under viewpoint change (docs/training.md)
)
FULL = DemoBudget(
    scenes=2000,
    vqgan_steps=1200,  # with --train-tokenizer only; the embedded tokenizer is this run (tools/make_demo_tokenizer.sh)
    vqgan_batch=16,
    # 100 steps on 480 pairs left align at chance and MSM at 7 % (issue 37): four times the steps, on every
    # training pair (four epochs of the 1,600); on the learned front end align stays at chance, unless the
    # consistency loss is weighed down, which made stage 2 worse (docs/model.md)
    stage1_steps=400,
    stage1_batch=16,
    # 2,400: what 25 min a seed bought with three models side by side; with the 2 x 2's fourth run and the longer
    # stage 1 a seed takes 35-36 min on 2 idle cores (docs/training.md)
    stage2_steps=2400,
    stage2_batch=32,
    stage2_lr=1e-3,
    # stage2_encoder_lr stays the decoder's 1e-3: at 2e-4 (a fifth) the cells from stage 1 lost 2.2 points of type
    # and up to 5 of object at --viewpoint none (docs/training.md), and the learned front end trains in stage 2 too
    val_every=300,  # correctness is checked every 300 steps on all 400 validation pairs
    val_pairs=400,
    stage1_pairs=None,
    # CLEVR-Change moves the camera and the light in its change pairs too: the faithful benchmark (docs/data.md)
    viewpoint="distractor",
    # identical_pairs stays 0: its models call every one of the 600 test images shown twice no change (seed 0)
)


def format_duration(seconds: float) -> str:
    """``45s``, ``12m``, ``1h05m``: a time left as a person reads it."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    hours, minutes = divmod(round(seconds / 60), 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m"


class Clock:
    """Wall-clock per phase, printed as the demo goes."""

    def __init__(self, verbose: bool = True) -> None:
        self.start = time.perf_counter()
        self.phases: dict[str, float] = {}  # seconds per phase name
        self.verbose = verbose

    def phase(self, name: str, message: str) -> None:
        self._t = time.perf_counter()
        self._name = name
        if self.verbose:
            logger.info("[%6.1fs] %s", time.perf_counter() - self.start, message, extra=TO_STDOUT)

    def done(self) -> float:
        seconds = time.perf_counter() - self._t
        self.add(self._name, seconds)
        return seconds

    def add(self, name: str, seconds: float) -> None:
        """Count ``seconds`` measured elsewhere (a worker process) towards phase ``name``."""
        self.phases[name] = round(self.phases.get(name, 0.0) + seconds, 2)

    @property
    def total(self) -> float:
        return time.perf_counter() - self.start


def ensure_benchmark(root: Path, scenes: int, seed: int, progress: bool, viewpoint: str = "none") -> None:
    """Generate the synthetic benchmark unless ``root`` already holds the same one (same scenes, size, seed and
    viewpoint)."""
    from procap.data.synthetic import generate

    meta = _benchmark_spec(root)
    if meta is not None:
        try:
            same = (len(meta["scenes"]), meta["size"], meta["seed"]) == (scenes, IMAGE_SIZE, seed)
            if same and _viewpoint_of(meta) == viewpoint:
                return
        except (KeyError, TypeError):  # not the same benchmark: it is written again
            pass
    generate(root, scenes, size=IMAGE_SIZE, seed=seed, workers=2, progress=progress, viewpoint=viewpoint)


def _benchmark_spec(root: Path) -> dict[str, Any] | None:
    """``root/scenes.json`` of a synthetic benchmark, or None when there is no readable one."""
    spec = root / "scenes.json"
    if not spec.is_file():
        return None
    try:
        meta = read_json(spec, "synthetic scenes file")
    except ProCapError:
        return None
    return meta if isinstance(meta, dict) else None


def _viewpoint_of(meta: dict[str, Any]) -> str:
    return meta.get("viewpoint", "none")  # benchmarks written before viewpoints had none


def run_folder(out: Path, seed: int, base_seed: int) -> Path:
    """Training runs of the base seed sit directly under ``out``; other seeds under ``out/seed<N>``."""
    return out if seed == base_seed else out / f"seed{seed}"


def stage_configs(
    budget: DemoBudget, out: Path, data: Path, seed: int, device: str, progress: bool, workers: int, folder: Path
) -> dict[str, TrainConfig]:
    """The TrainConfig of every training run of one seed (the VQGAN is shared by all seeds)."""
    common = _common_settings(data, seed, device, workers, progress)
    vq_path = str(out / "vqgan" / "vqgan.safetensors")
    vqgan = TrainConfig(
        stage="vqgan",
        out=str(out / "vqgan"),
        steps=budget.vqgan_steps,
        lr=budget.vqgan_lr,
        batch_size=budget.vqgan_batch,
        warmup_steps=max(1, budget.vqgan_steps // 10),
        **{**common, "decay": "none"},
    )
    stage1 = TrainConfig(
        stage="pretrain",
        out=str(folder / "stage1"),
        steps=budget.stage1_steps,
        lr=budget.stage1_lr,
        lr_start=1e-6,
        batch_size=budget.stage1_batch,
        warmup_steps=max(1, budget.stage1_steps // 10),
        vqgan=vq_path,
        procedures="crossfade",
        **common,
    )
    return {"vqgan": vqgan, "stage1": stage1, **_stage2_configs(budget, folder, vq_path, common)}


def _common_settings(data: Path, seed: int, device: str, workers: int, progress: bool) -> dict[str, Any]:
    """The TrainConfig fields every training run of the demo shares."""
    return {
        "preset": PRESET,
        "data": str(data),
        "dataset": "clevr-change",
        "seed": seed,
        "device": device,
        "workers": workers,
        "progress": progress,
        "log_every": 10,
        "decay": "cosine",
        "cache_features": True,
        "overwrite": True,  # the demo's folder is the demo's: a rerun replaces its runs (each swapped in when done)
    }


def _stage2_configs(budget: DemoBudget, folder: Path, vq_path: str, common: dict[str, Any]) -> dict[str, TrainConfig]:
    """The four captioning runs of one seed: from stage 1 or from scratch, with and without procedure queries."""
    stage2 = {
        "lr": budget.stage2_lr,
        "batch_size": budget.stage2_batch,
        "warmup_frac": 0.1,
        "val_every": budget.val_every,
        "val_pairs": budget.val_pairs,
        "select_metric": budget.select_metric,
        "identical_pairs": budget.identical_pairs,
        **common,
    }
    longer = budget.stage2_steps + budget.stage1_steps  # equal step budgets for the models without stage 1
    return {
        "procap": TrainConfig(
            stage="train",
            out=str(folder / "procap"),
            init=str(folder / "stage1" / "stage1.safetensors"),
            steps=budget.stage2_steps,
            encoder_lr=budget.stage2_encoder_lr,
            **stage2,
        ),
        "procap_no_stage1": TrainConfig(
            stage="train", out=str(folder / "procap_no_stage1"), vqgan=vq_path, steps=longer, **stage2
        ),
        "stage1_static": TrainConfig(
            stage="train",
            out=str(folder / "stage1_static"),
            init=str(folder / "stage1" / "stage1.safetensors"),
            num_keyframes=0,  # the stage-1 encoder with its procedure queries dropped
            steps=budget.stage2_steps,
            encoder_lr=budget.stage2_encoder_lr,
            **stage2,
        ),
        "static": TrainConfig(
            stage="train", out=str(folder / "static"), num_keyframes=0, vqgan=vq_path, steps=longer, **stage2
        ),
    }


def install_embedded_tokenizer(folder: Path) -> Path:
    """Copy the embedded tokenizer to ``<folder>/vqgan.safetensors``, where a trained one would be written."""
    from procap.core.files import atomic_write
    from procap.train.tokenizer import embedded_tokenizer_path

    data = embedded_tokenizer_path().read_bytes()
    return atomic_write(folder / "vqgan.safetensors", lambda tmp: Path(tmp).write_bytes(data))


def describe_keyframes(source: str, pairs: list) -> dict[str, Any]:
    """Stage-1 keyframes of the cache under the paper's confidence and the standardised one, printed and returned.

    Empty for the sources without a cache (cross-fade, truth: no scores)."""
    from procap.procedure.cache import keyframe_statistics

    if source in PROCEDURE_SOURCES:
        return {}
    stats = {scale: keyframe_statistics(source, pairs, 2, scale) for scale in ("paper", "standardize")}
    for scale, row in stats.items():
        positions = ", ".join(f"{t} {p:.2f}" for t, p in row["mean_position"].items())
        logger.info(
            f"         keyframes ({scale} confidence): {row['distinct']} distinct sets over {row['pairs']} pairs, "
            f"earliest frames {100 * row['earliest']:.0f} %; mean frame by type: {positions}",
            extra=TO_STDOUT,
        )
    return stats


def build_procedures(
    kind: str, data: Path, out: Path, pairs: list, vqgan_path: str, progress: bool, workers: int = 1
) -> str:
    """The stage-1 frame source for the demo, as a ``--procedures`` value.

    ``crossfade``: the linear cross-fade stand-in, no preparation. ``truth``: the benchmark's exact intermediate
    frames, rendered as stage 1 reads them (:class:`procap.train.datasets.TruthProcedures`). ``interpolated``: the
    real pipeline of ``procap.procedure`` (optical-flow interpolation of l = 7 frames, VQGAN-similarity confidence
    scores, top-k keyframes) written to ``<out>/procedures`` and read back through its ``CachedProcedures``.
    """
    if kind in PROCEDURE_SOURCES:
        return kind
    from procap.procedure.pipeline import PrepareOptions, prepare

    cache = out / "procedures"
    # Stage 1 computes its MSM targets from the frames itself, so the cache skips the per-frame VQ codes.
    prepare(
        PrepareOptions(
            dataset="clevr-change",
            root=str(data),
            out=str(cache),
            image_size=IMAGE_SIZE,
            vqgan=vqgan_path,
            store_codes=False,
            workers=max(1, workers),
            progress=progress,
        ),
        pairs=pairs,
    )
    return str(cache)


def evaluate_run(
    name: str,
    checkpoint: Path,
    pairs: list,
    metrics,
    cache: ImageCache,
    device: str,
    out: Path,
    truths: dict,
    progress: bool = True,
) -> dict[str, Any]:
    from procap.eval.split import evaluate_model, identical_pair_rate
    from procap.loading.checkpoint import load_checkpoint

    model, vocab, meta = load_checkpoint(checkpoint, map_location=device)
    extra = {
        "checkpoint": str(checkpoint),
        # the names procap evaluate gives them: best.safetensors is the step validation picked
        "checkpoint_step": meta["extra"].get("step"),
        "checkpoint_stage": meta["extra"].get("stage"),
        "num_keyframes": model.config.num_keyframes,
    }
    # the same image twice: every test image as both before and after, where the one true answer is no change
    extra["identical"] = identical_pair_rate(
        model, vocab, pairs, batch_size=32, cache=cache, device=device, progress=False
    )
    report = evaluate_model(
        model,
        vocab,
        pairs,
        metrics,
        batch_size=32,
        device=device,
        cache=cache,
        out=out / name,
        extra=extra,
        truths=truths,
        progress=progress,
    )
    return with_identical_change_rate(report)


def with_identical_change_rate(report: dict[str, Any]) -> dict[str, Any]:
    """``report`` with ``accuracy["identical_change_rate"]``: the share of its ``identical`` images captioned with a
    change (None where the run was evaluated before the demo tried identical images)."""
    rate = report.get("identical", {}).get("rate")
    report.setdefault("accuracy", {})["identical_change_rate"] = None if rate is None else 1.0 - rate
    return report


# What a finished seed's runs must share with this demo for ``--resume`` to read them back instead of training.
RESUME_SETTINGS = (
    "preset",
    "dataset",
    "steps",
    "batch_size",
    "lr",
    "encoder_lr",
    "decoder_lr",
    "warmup_frac",
    "decay",
    "seed",
    "num_keyframes",
    "val_every",
    "val_pairs",
    "select_metric",
    "device",
    "procedures",
    "identical_pairs",
)
# The value a run recorded before a setting existed trained with (its runs' config files lack the key).
RESUME_DEFAULTS = {"identical_pairs": 0.0}


def finished_reports(folder: Path, configs: dict[str, TrainConfig]) -> dict[str, dict[str, Any]] | None:
    """The four models' evaluation reports of a seed the demo finished before, read back for ``--resume``.

    Returns None when a model of the seed has no evaluation (the seed is then trained again, from scratch).

    Raises:
        ProCapError: naming the run folder, when a finished run was trained with other settings than ``configs``
            (another budget or seed): its figures would be mixed with this demo's.
    """
    from procap.eval.metrics import read_predictions

    reports = {}
    stage1_file = folder / "stage1" / "stage1_config.json"
    if stage1_file.is_file():  # the stage 1 of the seed's two pre-trained cells (another --procedures, say)
        _check_settings(folder / "stage1", read_json(stage1_file, "run configuration"), configs["stage1"])
    for name, _ in MODELS:
        run = folder / name
        if not all((run / f).is_file() for f in ("metrics.json", "results.json", "stage2_config.json")):
            return None
        _check_settings(run, read_json(run / "stage2_config.json", "run configuration"), configs[name])
        _check_departures(run)
        report = with_identical_change_rate(read_json(run / "metrics.json", "evaluation report"))
        reports[name] = {**report, "predictions": read_predictions(run / "results.json")}
    return reports


def _check_settings(run: Path, saved: dict[str, Any], config: TrainConfig) -> None:
    # runs record their resolved settings (learning rates filled in), paths absolute
    wanted = config.resolved().replay_dict()
    changed = [key for key in RESUME_SETTINGS if saved.get(key, RESUME_DEFAULTS.get(key)) != wanted.get(key)]
    if changed:
        raise ProCapError(
            f"--resume: {run} was trained with other settings ({', '.join(changed)}) than this demo; "
            "give a new --out, or run without --resume to train it again."
        )


def _check_departures(run: Path) -> None:
    """Refuse a finished run whose model departs from the paper otherwise than today's preset, or weighs stage 1's
    losses otherwise: the settings name the preset, and a preset's departures and weights change between releases
    (the learned front end of issue 54, then its consistency weight)."""
    from procap.core.config import ProCapConfig, get_preset
    from procap.loading.checkpoint import read_checkpoint_metadata

    checkpoint = run / "best.safetensors"
    if not checkpoint.is_file():
        return  # metrics.json names the checkpoint it scored; without it there is nothing to compare
    recorded = ProCapConfig.from_dict(read_checkpoint_metadata(checkpoint)["config"])
    wanted = get_preset(PRESET)
    changed = [
        f"departure {f.name}"
        for f in dataclasses.fields(wanted.departures)
        if getattr(recorded.departures, f.name) != getattr(wanted.departures, f.name)
    ]
    changed += [name for name in STAGE1_WEIGHTS if getattr(recorded, name) != getattr(wanted, name)]
    if changed:
        raise ProCapError(
            f"--resume: {run} was trained with another model ({', '.join(changed)}) than this demo's "
            f"{PRESET} preset; give a new --out, or run without --resume to train it again."
        )


def _mean_std(values: list[float]) -> dict[str, float]:
    return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0}


def aggregate(per_seed: list[dict[str, Any]], metrics) -> dict[str, Any]:
    """One model's report over seeds: the first seed's report plus ``seeds`` and mean / std of every figure.

    ``accuracy`` and ``metrics`` hold the means (fractions in [0, 1] and scores x100); ``accuracy_std`` and
    ``metrics_std`` the standard deviations across seeds (0 with one seed).
    """
    first = {k: v for k, v in per_seed[0].items() if k != "predictions"}
    scores = {m: _mean_std([r["metrics"][m] for r in per_seed]) for m in metrics}
    accuracy = {
        k: _mean_std([r["accuracy"][k] for r in per_seed])
        for k in ACCURACY_KEYS
        if all(r["accuracy"].get(k) is not None for r in per_seed)
    }
    return {
        **first,
        "metrics": {m: v["mean"] for m, v in scores.items()},
        "metrics_std": {m: v["std"] for m, v in scores.items()},
        "accuracy": {**first["accuracy"], **{k: v["mean"] for k, v in accuracy.items()}},
        "accuracy_std": {k: v["std"] for k, v in accuracy.items()},
        "seeds": [
            {"seed": r["seed"], "metrics": r["metrics"], "accuracy": {k: r["accuracy"].get(k) for k in ACCURACY_KEYS}}
            for r in per_seed
        ],
    }


def format_table(results: dict[str, dict], metrics) -> str:
    """Caption metrics and correctness rows (mean, and +- std over seeds when there are several)."""
    seeds = len(next(iter(results.values()))["seeds"])
    columns = [*metrics, "change", "type", "object", "distinct"]
    head = f"{'model':<27}" + "".join(f"{c:>14}" for c in columns)
    lines = [head, "-" * len(head)]
    for label, report in results.items():
        cells = []
        for column in columns:
            if column in metrics:
                mean, std = report["metrics"][column], report["metrics_std"][column]
            else:
                mean = report["accuracy"].get(column)
                std = report["accuracy_std"].get(column, 0.0)
                mean, std = (None, None) if mean is None else (100 * mean, 100 * std)
            text = "n/a" if mean is None else (f"{mean:.1f}" + (f" ±{std:.1f}" if seeds > 1 else ""))
            cells.append(f"{text:>14}")
        lines.append(f"{label:<27}" + "".join(cells))
    lines.append(f"(test split; change/type/object/distinct in %; {seeds} seed{'s' if seeds > 1 else ''})")
    return "\n".join(lines)


def format_failures(results: dict[str, dict]) -> str:
    """The failure kinds per model: misses on change pairs, false alarms on distractors, unparsed captions of change
    pairs (a count), moves called an add or a drop (mean, and +- std over seeds when there are several)."""
    from procap.eval.correctness import FAILURE_COLUMNS

    seeds = len(next(iter(results.values()))["seeds"])
    head = f"{'model':<27}" + "".join(f"{title:>18}" for _, title, _ in FAILURE_COLUMNS)
    lines = [head, "-" * len(head)]
    for label, report in results.items():
        cells = []
        for key, _, kind in FAILURE_COLUMNS:
            mean, std = report["accuracy"].get(key), report["accuracy_std"].get(key, 0.0)
            scale = 100.0 if kind == "fraction" else 1.0
            text = "n/a" if mean is None else f"{scale * mean:.1f}" + (f" ±{scale * std:.1f}" if seeds > 1 else "")
            cells.append(f"{text:>18}")
        lines.append(f"{label:<27}" + "".join(cells))
    lines.append(
        "(miss: change pairs captioned 'no change', false pos.: distractors captioned with a change, same image: every "
        "test image shown as both before and after and captioned with a change, move as add/drop: move pairs, in %; "
        "unparsed: change pairs whose caption the grammar cannot read, counted wrong)"
    )
    return "\n".join(lines)


# (model, baseline) run folders of the paired comparisons: ProCap against each of the 2 x 2's other cells
PAIRED_COMPARISONS = (("procap", "static"), ("procap", "stage1_static"), ("procap", "procap_no_stage1"))
INTERACTION = "2x2 interaction"  # the label of the interaction rows in the paired table


def paired_comparisons(predictions: dict[str, list[dict[str, str]]], truths: dict) -> list[dict[str, Any]]:
    """ProCap minus each other cell on every paired figure, then the 2 x 2 interaction; seeds paired in order,
    bootstrap over test pairs.

    ``predictions`` maps a run folder name (:data:`MODELS`) to its test predictions, one ``{id: caption}`` per seed.
    The interaction, (ProCap - stage-1 static) - (no stage 1 - static), is what the queries gain with stage 1 beyond
    what they gain without it: the paper's claim is that it is positive.
    """
    from procap.eval.paired import PAIRED_FIGURES, paired_contrast, paired_difference

    labels = dict(MODELS)
    rows = []
    for model, baseline in PAIRED_COMPARISONS:
        for figure in PAIRED_FIGURES:
            result = paired_difference(figure, predictions[model], predictions[baseline], truths)
            rows.append({"model": labels[model], "baseline": labels[baseline], **result})
    cells = [(1.0, "procap"), (-1.0, "stage1_static"), (-1.0, "procap_no_stage1"), (1.0, "static")]
    for figure in PAIRED_FIGURES:
        result = paired_contrast(figure, [(w, predictions[name]) for w, name in cells], truths)
        result.pop("accuracies")
        rows.append({"model": labels["procap"], "baseline": INTERACTION, **result})
    return rows


def paired_from_folder(out: str | Path) -> list[dict[str, Any]]:
    """:func:`paired_comparisons` of a demo folder, read from its seeds' ``results.json`` files.

    Every seed whose four models were evaluated counts, so a demo stopped between seeds is compared over the seeds
    it finished.
    """
    from procap.data.datasets import load_split
    from procap.eval.correctness import scene_truths
    from procap.eval.metrics import read_predictions

    out = Path(out)
    if not (out / "data" / "scenes.json").is_file():
        raise ProCapError(f"{out} is not a demo folder: {out / 'data' / 'scenes.json'} does not exist.")
    folders = [out, *sorted(out.glob("seed*"), key=lambda f: int(f.name[4:]) if f.name[4:].isdigit() else -1)]
    finished = [f for f in folders if all((f / name / "results.json").is_file() for name, _ in MODELS)]
    if not finished:
        raise ProCapError(f"{out} holds no seed whose four models were evaluated (no */results.json).")
    predictions = {name: [read_predictions(f / name / "results.json") for f in finished] for name, _ in MODELS}
    test = [p for p in load_split("clevr-change", out / "data", "test") if p.id in predictions["procap"][0]]
    return paired_comparisons(predictions, scene_truths(out / "data", test))


def format_paired(rows: list[dict[str, Any]]) -> str:
    """The paired comparisons as a table: difference in points with its 95 % intervals over the test pairs and over
    the seeds, and each seed's."""
    head = f"{'ProCap (k=2) minus':<28}{'figure':>8}{'difference':>12}{'over pairs':>18}{'over seeds':>18}   per seed"
    lines = [head, "-" * (len(head) + 12)]
    for row in rows:
        interval = f"[{100 * row['low']:+.1f}, {100 * row['high']:+.1f}]"
        over_seeds = (  # one seed: no spread to measure
            "n/a" if row["seed_low"] is None else f"[{100 * row['seed_low']:+.1f}, {100 * row['seed_high']:+.1f}]"
        )
        seeds = " ".join(f"{100 * d:+.1f}" for d in row["per_seed"])
        lines.append(
            f"{row['baseline']:<28}{row['figure']:>8}{100 * row['difference']:>+12.1f}{interval:>18}{over_seeds:>18}"
            f"   {seeds}"
        )
    pairs = {row["figure"]: row["pairs"] for row in rows}
    lines.append(
        "(points of accuracy, mean over seeds; 95 % intervals: over pairs, a bootstrap over the test pairs with both "
        "models on each resample; over seeds, Student's t on the seeds' differences, from two seeds on; pairs: "
        f"{', '.join(f'{k} {v}' for k, v in pairs.items())})"
    )
    if any(row["baseline"] == INTERACTION for row in rows):
        lines.append(f"({INTERACTION}: (ProCap - stage-1 static) - (no stage 1 - static), all four on each resample)")
    return "\n".join(lines)


def pick_samples(pairs: list, count: int) -> list:
    """One test pair per change type (then more), so the examples show every kind of change."""
    by_type: dict[str, list] = {}
    for pair in pairs:
        by_type.setdefault(pair.change_type or "pair", []).append(pair)
    chosen: list = []
    depth = 0
    while len(chosen) < min(count, len(pairs)):
        for members in by_type.values():
            if depth < len(members) and len(chosen) < count:
                chosen.append(members[depth])
        depth += 1
    return chosen


def write_samples(samples: list, reports: dict[str, dict], cache: ImageCache, out: Path) -> list[dict[str, Any]]:
    """samples.json and a before|after PNG per example under ``out/samples``."""
    from PIL import Image

    from procap.core.files import atomic_write_json

    folder = out / "samples"
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for pair in samples:
        strip = torch.cat([cache(pair.before_path), cache(pair.after_path)], dim=2)  # (3, S, 2S)
        image = (strip.clamp(0, 1) * 255).round().byte().permute(1, 2, 0).numpy()
        Image.fromarray(image).save(folder / f"{Path(pair.id).stem}.png")
        rows.append(
            {
                "id": pair.id,
                "change_type": pair.change_type,
                "image": f"samples/{Path(pair.id).stem}.png",
                **{label: r["predictions"][pair.id] for label, r in reports.items()},
                "references": list(pair.captions),
            }
        )
    atomic_write_json(out / "samples.json", rows)
    return rows


def default_jobs(device: str, threads: int | None = None) -> int:
    """How many of a seed's stage-2 runs share the machine: one per thread (at most one per model) on a CPU with two
    or more threads, else one.

    Small models barely use a second thread: on 2 cores two one-thread runs side by side train 1.37x the steps per
    second of one run on both threads, three 1.27x (docs/training.md, "Runs side by side"), so the four runs of a
    seed go two at a time there, in two rounds of nearly equal length.
    """
    threads = torch.get_num_threads() if threads is None else threads
    return min(len(MODELS), threads) if device == "cpu" and threads >= 2 else 1


def _train_in_worker(
    name: str, configs: dict[str, TrainConfig], splits: dict, vocab, threads: int
) -> tuple[str, Path, dict[str, float]]:
    """One model's stage 2 in a worker process: its name, best checkpoint and seconds."""
    from procap.train.stage2 import train

    torch.set_num_threads(threads)  # the process owns its share of the cores
    cache = ImageCache(IMAGE_SIZE)  # its own: the parent's would be pickled across for every run
    start = time.perf_counter()
    best = train(configs[name], pairs=splits["train"], val_pairs=splits["val"], vocab=vocab, cache=cache)
    return name, best, {name: time.perf_counter() - start}


class _LinesToParent(io.TextIOBase):
    """A worker's stdout or stderr: each whole line goes to the parent, which prints it with the demo's clock
    above its progress line (two processes writing one terminal would cut into each other's lines)."""

    def __init__(self, queue: Any, stream: str) -> None:
        self.queue, self.stream, self.pending = queue, stream, ""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        lines = (self.pending + text).split("\n")
        self.pending = lines.pop()
        for line in lines:
            self.queue.put((self.stream, line))
        return len(text)

    def flush(self) -> None:
        pass


def _start_worker(queue: Any, log_level: int) -> None:
    """Pool initializer: the worker's output lines go to the parent through ``queue``, its log records (validation
    lines, warnings) among them at the parent's level: a spawned process starts with logging unset."""
    sys.stdout = _LinesToParent(queue, "out")
    sys.stderr = _LinesToParent(queue, "err")
    start_console_logging(log_level)
    follow_parent()


def follow_parent(every_s: float = 1.0) -> threading.Thread:
    """End this process (SIGTERM: a training run saves and stops) once the process that started it is gone.

    A demo killed with SIGKILL cannot stop its pool, and its workers would train on into its output folder for an
    hour; a worker whose parent died is handed to another process, so a change of ``os.getppid()`` tells.
    """
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(every_s)
        os.kill(os.getpid(), signal.SIGTERM)

    thread = threading.Thread(target=watch, name="demo-parent-watch", daemon=True)
    thread.start()
    return thread


# A file's mtime comes from a coarser clock than time.time() (the kernel's tick; whole seconds on some file systems):
# a log written just after ``since`` was taken can read as older than it
MTIME_SLACK_S = 2.0


def _live_log(out: Path, since: float) -> Path | None:
    """The log.jsonl a stage-2 run in ``out`` is writing now: in ``out``, or in the folder beside it where a run that
    replaces an earlier one trains (:class:`procap.train.run_folder.RunFolder`); a log not written since ``since``
    (epoch seconds) is the earlier run's."""
    candidates = [out / "log.jsonl", *out.parent.glob(f".{out.name[:32]}.replacing-*/log.jsonl")]
    live = []
    for path in candidates:
        with contextlib.suppress(OSError):  # a folder swapped in or removed between the listing and the stat
            if path.stat().st_mtime >= since - MTIME_SLACK_S:
                live.append((path.stat().st_mtime, path))
    return max(live)[1] if live else None


def _last_step(path: Path) -> dict[str, Any] | None:
    """The last training record (``step``, ``items_per_s``) of a log.jsonl being written, or None."""
    try:
        records = read_json_lines(path, "log", partial=True)
    except ProCapError:  # swapped in or removed while read (its error is a ProCapError naming the file)
        return None
    return next((r for r in reversed(records) if isinstance(r, dict) and "items_per_s" in r), None)


class SideBySideMonitor:
    """The parent's view of the stage-2 runs training in worker processes.

    A thread prints the workers' output lines (validation scores, warnings) stamped with the demo's clock and, with
    progress on, one status line of every run: its steps and steps per second, read from the log.jsonl it writes.
    On a terminal the line is redrawn in place every second; elsewhere (a log file) it is printed every
    :attr:`EVERY_S` seconds. Without progress only the stamped lines are printed.
    """

    EVERY_S = 30.0

    def __init__(
        self,
        configs: dict[str, TrainConfig],
        clock: Clock,
        queue: Any,
        progress: bool,
        jobs: int = 1,
        later_seeds: int = 0,
        seed_started: float | None = None,
        evaluate_s: float = 0.0,
    ) -> None:
        self.configs, self.clock, self.queue, self.progress = configs, clock, queue, progress
        self.jobs, self.later_seeds, self.evaluate_s = jobs, later_seeds, evaluate_s
        # the demo's clock when this seed began (stage 1 included): a later seed is taken to last as long
        self.seed_started = clock.total if seed_started is None else seed_started
        self.since = time.time()
        self.first_seen: dict[str, float] = {}  # when each run's log appeared: its wall-clock rate counts from there
        self.done: set[str] = set()
        self.terminal = progress and sys.stdout.isatty()
        self.drawn = False
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="demo-progress", daemon=True)

    def __enter__(self) -> Self:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()
        self._forward()  # what the workers wrote last
        with self.lock:
            self._clear()

    def say(self, text: str, stream: Any = None) -> None:
        """Log one line, stamped with the demo's clock, above the status line."""
        with self.lock:
            self._clear()
            if stream is sys.stderr:  # a worker's stderr: its warnings, shown even with --quiet
                logger.warning("[%6.1fs] %s", self.clock.total, text)
            else:
                logger.info("[%6.1fs] %s", self.clock.total, text, extra=TO_STDOUT)
            self._draw()

    def finished(self, name: str) -> None:
        self.done.add(name)

    def status(self) -> str:
        """``stage 2: procap 120/300 2.4 steps/s 3m left | static 80/450 1.9 steps/s 5m left | ... | phase 6m left,
        demo 40m left``, runs by their folder names.

        The rate shown is the trainer's (steps per second of training); the time left comes from each run's steps
        per second of wall clock since its log appeared, validation included. A run still waiting is given the mean
        of those rates, the phase's time left places the waiting runs on the first free of ``jobs`` processes, and
        the demo's adds this seed's evaluation (``evaluate_s``: as long as an earlier seed's, 0 before one was
        measured) and each later seed at this one's length.
        """
        parts: list[str] = []
        left: list[tuple[float, float]] = []  # (seconds left, steps per second) of each run with a measured rate
        waiting: list[int] = []  # the steps of each run not started
        now = time.time()
        for name, _ in MODELS:
            cfg = self.configs[name]
            steps = cfg.steps
            assert steps is not None  # stage_configs gives every run of the demo its steps
            if name in self.done:
                parts.append(f"{name} done")
                continue
            log = _live_log(Path(cfg.out), self.since)
            record = _last_step(log) if log else None
            if record is None:
                parts.append(f"{name} {'starting' if log else 'waiting'}")
                waiting.append(steps)
                continue
            self.first_seen.setdefault(name, now)
            rate = float(record["items_per_s"]) / max(1, (cfg.batch_size or 1) * cfg.grad_accum)
            wall_rate = int(record["step"]) / max(1.0, now - self.first_seen[name])
            remaining = (steps - int(record["step"])) / wall_rate if wall_rate > 0 else None
            shown_left = f" {format_duration(remaining)} left" if remaining is not None else ""
            parts.append(f"{name} {record['step']}/{steps} {rate:.1f} steps/s{shown_left}")
            if remaining is not None:
                left.append((remaining, wall_rate))
        summary = self._time_left(left, waiting)
        return "stage 2: " + " | ".join(parts + ([summary] if summary else []))

    def _time_left(self, running: list[tuple[float, float]], waiting: list[int]) -> str:
        """``phase 6m left, demo 40m left``, or empty before any run has a measured rate."""
        if not running:
            return ""
        mean_rate = sum(rate for _, rate in running) / len(running)
        slots = sorted(seconds for seconds, _ in running) + [0.0] * max(0, self.jobs - len(running))
        for steps in waiting:  # each waiting run starts on the process that frees first
            slots.sort()
            slots[0] += steps / mean_rate
        phase = max(slots)
        evaluate = self.evaluate_s
        seed_length = self.clock.total - self.seed_started + phase + evaluate
        total = phase + evaluate + self.later_seeds * seed_length
        return f"phase {format_duration(phase)} left, demo {format_duration(total)} left"

    def _clear(self) -> None:
        if self.drawn:
            sys.stdout.write("\r\x1b[K")
            sys.stdout.flush()
            self.drawn = False

    def _draw(self) -> None:
        if not self.terminal:
            return
        width = shutil.get_terminal_size().columns
        sys.stdout.write("\r" + f"[{self.clock.total:6.1f}s] {self.status()}"[: max(20, width - 1)])
        sys.stdout.flush()
        self.drawn = True

    def _forward(self) -> None:
        while True:
            try:
                stream, line = self.queue.get_nowait()
            except queue_module.Empty:
                return
            self.say(line, sys.stderr if stream == "err" else sys.stdout)

    def _run(self) -> None:
        printed = time.monotonic()
        while not self.stop.wait(1.0):
            self._forward()
            if self.terminal:
                with self.lock:
                    self._draw()
            elif self.progress and time.monotonic() - printed >= self.EVERY_S:
                self.say(self.status())
                printed = time.monotonic()


def train_seed(
    seed: int,
    configs: dict[str, TrainConfig],
    splits: dict,
    vocab,
    cache: ImageCache,
    clock: Clock,
    budget: DemoBudget,
    procedures: str,
    jobs: int = 1,
    later_seeds: int = 0,
    evaluate_s: float = 0.0,
) -> dict[str, Path]:
    """Stage 1, then the four stage-2 runs of one seed; returns each model's best checkpoint.

    ``later_seeds`` and ``evaluate_s`` (the seconds one seed's evaluation took) feed the status line's time left.

    Stage 1 runs once, on every thread: ProCap and the stage-1 static pair both start from it. With ``jobs > 1`` the
    stage-2 runs then train side by side in ``jobs`` spawned processes that split the threads between them; each
    run is the same computation as in turn (same seed, data order and steps), so only the thread count of its
    floating-point reductions differs.
    """
    from procap.train.stage1 import pretrain

    stage1_pairs = splits["train"][: budget.stage1_pairs] if budget.stage1_pairs else splits["train"]
    seed_started = clock.total
    clock.phase("stage1", f"seed {seed}: stage 1 ({procedures}), {budget.stage1_steps} steps x {budget.stage1_batch}")
    pretrain(configs["stage1"], pairs=stage1_pairs, vocab=vocab, cache=cache)
    clock.done()
    if jobs > 1:
        # the configs' progress is the demo's --progress / --no-progress
        outlook = {"later_seeds": later_seeds, "seed_started": seed_started, "evaluate_s": evaluate_s}
        return _train_side_by_side(seed, configs, splits, vocab, clock, jobs, configs["procap"].progress, outlook)
    return _train_in_turn(seed, configs, splits, vocab, cache, clock)


def _train_in_turn(
    seed: int, configs: dict[str, TrainConfig], splits: dict, vocab: Any, cache: ImageCache, clock: Clock
) -> dict[str, Path]:
    """The four stage-2 runs of one seed one after the other, in this process; each model's best checkpoint."""
    from procap.train.stage2 import train

    best = {}
    for name, label in MODELS:
        cfg = configs[name]
        clock.phase(name, f"seed {seed}: stage 2, {label}: {cfg.steps} steps x {cfg.batch_size}")
        best[name] = train(cfg, pairs=splits["train"], val_pairs=splits["val"], vocab=vocab, cache=cache)
        clock.done()
    return best


def _train_side_by_side(
    seed: int,
    configs: dict[str, TrainConfig],
    splits: dict,
    vocab,
    clock: Clock,
    jobs: int,
    progress: bool = True,
    outlook: dict[str, Any] | None = None,
) -> dict[str, Path]:
    import functools
    import multiprocessing

    threads = max(1, torch.get_num_threads() // jobs)
    quiet = {name: dataclasses.replace(cfg, progress=False) for name, cfg in configs.items()}  # bars would interleave
    labels = dict(MODELS)
    clock.phase(
        "side_by_side",
        f"seed {seed}: the {len(MODELS)} stage-2 runs side by side "
        f"({jobs} processes x {threads} thread{'s' if threads > 1 else ''}): "
        + ", ".join(f"{label} {quiet[name].steps} steps" for name, label in MODELS),
    )
    run = functools.partial(_train_in_worker, configs=quiet, splits=splits, vocab=vocab, threads=threads)
    best = {}
    # spawn, not fork: a child forked after the parent used torch's OpenMP pool can deadlock in it.
    context = multiprocessing.get_context("spawn")
    lines = context.Queue()  # the workers' output lines, printed by the parent (SideBySideMonitor)
    log_level = logging.getLogger(LOGGER_NAME).getEffectiveLevel()
    pool = context.Pool(jobs, initializer=_start_worker, initargs=(lines, log_level))
    finished = False
    try:
        with SideBySideMonitor(quiet, clock, lines, progress, jobs=jobs, **(outlook or {})) as monitor:
            for name, checkpoint, seconds in pool.imap_unordered(run, labels):
                best[name] = checkpoint
                monitor.finished(name)
                for phase, value in seconds.items():
                    clock.add(phase, value)
                if clock.verbose:
                    monitor.say(f"seed {seed}: {labels[name]} done ({seconds[name]:.0f} s of stage 2)")
            # Let the workers exit on their own: terminating them skipped their clean-up, and the semaphores they
            # held were reported as leaked when the demo ended.
            pool.close()
            pool.join()
            finished = True
    finally:
        if not finished:  # a run failed (or Ctrl-C): stop the others instead of waiting for them
            pool.terminate()
            pool.join()
        lines.close()
        lines.join_thread()
    clock.done()
    return best


def run_demo(
    out: Path | str,
    quick: bool = False,
    seed: int = 0,
    device: str = "cpu",
    workers: int = 0,
    progress: bool = True,
    budget: DemoBudget | None = None,
    procedures: str = "interpolated",
    seeds: int = 1,
    train_tokenizer: bool = False,
    jobs: int | None = None,
    viewpoint: str | None = None,
    resume: bool = False,
) -> dict[str, Any]:
    """Run the demo end to end and return what it writes to ``<out>/metrics.json``.

    Args:
        seeds: number of training seeds (``seed``, ``seed + 1``, ...); the figures are reported per seed and as
            mean +- std.
        train_tokenizer: fit a new VQGAN for ``budget.vqgan_steps`` steps instead of using the embedded one
            (:func:`procap.train.tokenizer.embedded_tokenizer_path`).
        jobs: training runs of a seed side by side, each in its own process (default :func:`default_jobs`).
        procedures: stage-1 frames, one of :data:`procap.core.config.DEMO_PROCEDURES` (:func:`build_procedures`).
        viewpoint: the benchmark's view change within a pair (:data:`procap.core.config.VIEWPOINTS`,
            :mod:`procap.data.synthetic`); None: the budget's (``distractor`` for the full demo, ``none`` for the
            quick one).
        resume: read back every seed of ``out`` whose four models were evaluated (:func:`finished_reports`) and
            train only the others: an interrupted demo goes on from its last finished seed.
    """
    from procap.core.files import atomic_write_json

    out, budget = Path(out), budget or (QUICK if quick else FULL)
    viewpoint = budget.viewpoint if viewpoint is None else viewpoint
    jobs = _checked_jobs(seed, seeds, procedures, viewpoint, jobs, device)
    study = _Study(out, seed, budget, device, progress, workers, procedures, jobs, resume, viewpoint, seeds)
    _prepare(study, train_tokenizer)
    per_model: dict[str, list[dict]] = {name: [] for name, _ in MODELS}
    for run_seed in range(seed, seed + seeds):
        reports = _seed_reports(study, run_seed)
        for name, _ in MODELS:
            per_model[name].append({**reports[name], "seed": run_seed})
    summary, samples = _summarise(study, per_model, quick, seeds, train_tokenizer)
    atomic_write_json(out / "metrics.json", summary, indent=1)
    logger.info(summary_text(summary["results"], study.metrics, samples, summary, study.note), extra=TO_STDOUT)
    _write_report(out, study.clock)
    return summary


@dataclass
class _Study:
    """What every seed of one demo shares: where it writes, its settings, the benchmark, stage 1's frames, the
    metrics and the clock (the last groups are filled in by :func:`_prepare`)."""

    out: Path
    base_seed: int
    budget: DemoBudget
    device: str
    progress: bool
    workers: int
    procedures: str
    jobs: int
    resume: bool
    viewpoint: str
    seeds: int
    clock: Clock = dataclasses.field(default_factory=Clock)
    cache: ImageCache = dataclasses.field(default_factory=lambda: ImageCache(IMAGE_SIZE))
    splits: dict[str, list] = dataclasses.field(default_factory=dict)
    test: list = dataclasses.field(default_factory=list)
    truths: Any = None
    vocab: Vocabulary | None = None
    source: str = ""  # stage 1's frames: a procedure cache or a named source
    keyframes: dict[str, Any] = dataclasses.field(default_factory=dict)
    metrics: Any = None
    note: str | None = None
    evaluated: int = 0  # seeds trained and evaluated by this call (not read back by --resume)

    @property
    def data(self) -> Path:
        return self.out / "data"


def _prepare(study: _Study, train_tokenizer: bool) -> None:
    """The phases before training: the benchmark, the tokenizer, stage 1's frames, the metrics to report."""
    from procap.eval.split import default_metrics

    if study.resume:
        _check_resumed_benchmark(study.data, study.viewpoint)
    benchmark = _load_benchmark(study.data, study.budget, study.base_seed, study.progress, study.viewpoint, study.clock)
    study.splits, study.test, study.truths, study.vocab = benchmark
    train = study.splits["train"]
    logger.info(
        f"         pairs: {len(train)} train / {len(study.splits['val'])} val / {len(study.test)} test, "
        f"vocabulary {len(study.vocab)} words",
        extra=TO_STDOUT,
    )
    configs = stage_configs(
        study.budget, study.out, study.data, study.base_seed, study.device, study.progress, study.workers, study.out
    )
    _prepare_tokenizer(train_tokenizer, configs["vqgan"], train, study.budget, study.clock)
    study.source, study.keyframes = _stage1_procedures(
        study.procedures, study.data, study.out, train, study.budget, configs, study.progress, study.clock
    )
    study.metrics, study.note = default_metrics(DEMO_METRICS)


def _summarise(
    study: _Study, per_model: dict[str, list[dict]], quick: bool, seeds: int, train_tokenizer: bool
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``metrics.json``'s content (figures per model over seeds, paired comparisons, settings, timings) and the
    example captions written beside it."""
    results = {label: aggregate(per_model[name], study.metrics) for name, label in MODELS}
    first_reports = {label: per_model[name][0] for name, label in MODELS}
    samples = write_samples(pick_samples(study.test, 6), first_reports, study.cache, study.out)
    predictions = {name: [report["predictions"] for report in per_model[name]] for name, _ in MODELS}
    summary = {
        "quick": quick,
        "seed": study.base_seed,
        "seeds": list(range(study.base_seed, study.base_seed + seeds)),
        "procedures": study.procedures,
        "viewpoint": study.viewpoint,
        "tokenizer": _tokenizer_name(train_tokenizer),
        "keyframes": study.keyframes,
        "budget": dataclasses.asdict(study.budget),
        "device": study.device,
        "threads": torch.get_num_threads(),
        "jobs": study.jobs,
        "pairs": {"train": len(study.splits["train"]), "val": len(study.splits["val"]), "test": len(study.test)},
        "results": results,
        "paired": paired_comparisons(predictions, study.truths),
        "phases_s": study.clock.phases,
        "total_s": round(study.clock.total, 1),
        "note": study.note,
    }
    return summary, samples


def _tokenizer_name(train_tokenizer: bool) -> str:
    from procap.train.tokenizer import embedded_tokenizer_path

    return "trained" if train_tokenizer else f"embedded ({embedded_tokenizer_path().name})"


def _stage1_procedures(
    procedures: str,
    data: Path,
    out: Path,
    train_pairs: list,
    budget: DemoBudget,
    configs: dict[str, TrainConfig],
    progress: bool,
    clock: Clock,
) -> tuple[str, dict[str, Any]]:
    """The ``procedures`` phase: stage 1's frames for the training pairs it uses, and their keyframe statistics."""
    clock.phase("procedures", f"stage-1 procedures: {procedures}")
    # CLEVR-Change pairs alternate change / distractor, so any prefix is balanced.
    stage1_pairs = train_pairs[: budget.stage1_pairs] if budget.stage1_pairs else train_pairs
    workers = max(1, min(2, torch.get_num_threads()))
    vqgan = configs["stage1"].vqgan
    assert vqgan is not None  # stage_configs names the demo's VQGAN in every config but the VQGAN's own
    source = build_procedures(procedures, data, out, stage1_pairs, vqgan, progress, workers=workers)
    keyframes = describe_keyframes(source, stage1_pairs)
    clock.done()
    return source, keyframes


def _seed_reports(study: _Study, run_seed: int) -> dict[str, dict[str, Any]]:
    """One seed's four models, trained and evaluated on the test pairs, or (``resume``) read back when finished."""
    folder = run_folder(study.out, run_seed, study.base_seed)
    configs = stage_configs(
        study.budget, study.out, study.data, run_seed, study.device, study.progress, study.workers, folder
    )
    configs["stage1"] = dataclasses.replace(configs["stage1"], procedures=study.source)
    reports = finished_reports(folder, configs) if study.resume else None
    if reports is not None:
        study.clock.phase("resume", f"seed {run_seed}: finished before, its evaluation read back from {folder}")
    else:
        reports = _train_and_evaluate(study, run_seed, configs, folder)
    study.clock.done()
    return reports


def _train_and_evaluate(
    study: _Study, run_seed: int, configs: dict[str, TrainConfig], folder: Path
) -> dict[str, dict[str, Any]]:
    """One seed's four models trained, then evaluated on the test pairs (the clock's ``evaluate`` phase is left
    running: :func:`_seed_reports` ends it)."""
    best = train_seed(
        run_seed,
        configs,
        study.splits,
        study.vocab,
        study.cache,
        study.clock,
        study.budget,
        study.procedures,
        study.jobs,
        later_seeds=study.base_seed + study.seeds - 1 - run_seed,
        evaluate_s=study.clock.phases.get("evaluate", 0.0) / study.evaluated if study.evaluated else 0.0,
    )
    study.evaluated += 1
    study.clock.phase("evaluate", f"seed {run_seed}: evaluation on {len(study.test)} test pairs")
    return {
        name: evaluate_run(
            name,
            best[name],
            study.test,
            study.metrics,
            study.cache,
            study.device,
            folder,
            study.truths,
            study.progress,
        )
        for name, _ in MODELS
    }


def _write_report(out: Path, clock: Clock) -> None:
    """The ``report`` phase: ``report.html`` beside ``metrics.json``."""
    from procap.experiments.report import build_report

    clock.phase("report", "report.html: metrics, curves, examples with imagined procedures")
    build_report(out)
    clock.done()


def _check_resumed_benchmark(data: Path, viewpoint: str) -> None:
    """Refuse to go on with a demo folder whose benchmark has another viewpoint: it would be generated again in
    place and its finished seeds, trained on the old one, mixed with new ones."""
    meta = _benchmark_spec(data)
    if meta is None:
        return  # no readable benchmark: generated again, and no finished seed can match it
    found = _viewpoint_of(meta)
    if found != viewpoint:
        raise ProCapError(
            f"--resume: {data} holds the benchmark with viewpoint {found!r}, this demo asks for {viewpoint!r}; "
            f"pass --viewpoint {found} to go on with that run, or give a new --out."
        )


def _checked_jobs(seed: int, seeds: int, procedures: str, viewpoint: str, jobs: int | None, device: str) -> int:
    """Refuse a bad demo option before any work; the training runs side by side (``jobs``, resolved)."""
    from procap.data.synthetic import check_viewpoint

    validate.integer(seeds, "seeds", minimum=1, maximum=MAX_SEEDS)  # each seed trains every model again
    validate.seed(seed, "seed", count=seeds)  # runs use seed .. seed + seeds - 1
    if procedures not in DEMO_PROCEDURES:
        raise ValueError(f"procedures must be one of {', '.join(DEMO_PROCEDURES)}, got {procedures!r}")
    check_viewpoint(viewpoint)
    jobs = default_jobs(device) if jobs is None else jobs
    if not 1 <= jobs <= len(MODELS):
        raise ValueError(f"jobs must be between 1 and {len(MODELS)}, got {jobs}")
    return jobs


def _load_benchmark(
    data: Path, budget: DemoBudget, seed: int, progress: bool, viewpoint: str, clock: Clock
) -> tuple[dict[str, list], list, Any, Vocabulary]:
    """The ``data`` phase: the synthetic benchmark (made if missing), its splits, the test pairs the demo scores
    (with their scene truths) and the vocabulary of the training captions."""
    from procap.data import load_split
    from procap.eval.correctness import scene_truths
    from procap.train.common import build_vocab

    clock.phase(
        "data",
        f"synthetic CLEVR-Change benchmark: {budget.scenes} scenes at {IMAGE_SIZE} px, viewpoint {viewpoint} -> {data}",
    )
    ensure_benchmark(data, budget.scenes, seed, progress, viewpoint)
    splits = {s: load_split("clevr-change", data, s) for s in ("train", "val", "test")}
    test = splits["test"][: budget.max_test_pairs] if budget.max_test_pairs else splits["test"]
    truths = scene_truths(data, test)
    vocab = build_vocab(splits["train"], "clevr-change")
    clock.done()
    return splits, test, truths, vocab


def _prepare_tokenizer(
    train_tokenizer: bool, config: TrainConfig, train_pairs: list, budget: DemoBudget, clock: Clock
) -> None:
    """The ``vqgan`` phase: a VQGAN trained on the training pairs, or the embedded one installed in its folder."""
    from procap.train.tokenizer import embedded_tokenizer_path
    from procap.train.vqgan_train import train_vqgan

    if train_tokenizer:
        clock.phase("vqgan", f"VQGAN ({PRESET} preset tokenizer): {budget.vqgan_steps} steps")
        train_vqgan(config, pairs=train_pairs)
    else:
        clock.phase("vqgan", f"VQGAN: the embedded {PRESET} tokenizer ({embedded_tokenizer_path().name})")
        install_embedded_tokenizer(Path(config.out))
    clock.done()


def summary_text(results: dict, metrics, samples: list, summary: dict, note: str | None) -> str:
    """What the demo reports at its end: the table, the failure kinds, the paired comparisons, examples, timings."""
    parts = ["", format_table(results, metrics), "", format_failures(results)]
    if summary.get("paired"):
        parts += ["", format_paired(summary["paired"])]
    if note:
        parts.append(note)
    parts.append("\nexamples (test split, first seed):")
    for row in samples:
        parts.append(f"  {row['id']} [{row['change_type']}]")
        parts += [f"    {label:<27} {row[label]}" for label in results]
        parts.append(f"    {'reference':<27} {row['references'][0]}")
    parts.append(
        f"\ntotal {summary['total_s']:.0f} s, {describe_parallelism(summary)}; phases: "
        + ", ".join(f"{k} {v:.0f}s" for k, v in summary["phases_s"].items())
    )
    return "\n".join(parts)


def describe_parallelism(summary: dict) -> str:
    """How the demo used the machine: ``on 2 threads``, or with stage 2 side by side ``stage 2 as 3 processes x 1
    thread side by side (the rest on 3 threads)``."""
    threads, jobs = summary["threads"], summary.get("jobs", 1)
    if jobs <= 1:
        return f"on {threads} thread{'s' if threads != 1 else ''}"
    each = max(1, threads // jobs)
    return (
        f"stage 2 as {jobs} processes x {each} thread{'s' if each != 1 else ''} side by side "
        f"(the rest on {threads} thread{'s' if threads != 1 else ''})"
    )
