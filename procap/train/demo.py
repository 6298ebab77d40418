"""``procap demo``: the whole pipeline on the embedded synthetic benchmark, ProCap vs the static-pair baseline.

Steps: generate the synthetic CLEVR-format benchmark (64 px), fit a small VQGAN (the ``tiny`` preset's), build
stage-1 procedures, pre-train (stage 1) and train the captioner (stage 2) with the ``tiny`` preset, train the
static-pair baseline (k = 0, no stage 1) with the same stage-2 budget, and evaluate both on the test split.

The budgets below are what fits the time limits on 2 CPU cores (``--quick``: 3 minutes, full: 15 minutes).
They depart from the paper's schedules in the ways a few-minute CPU run needs: higher learning rates with a
cosine decay after warm-up, and a few hundred steps instead of 200k / 40 epochs.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from procap.train.config import TrainConfig
from procap.train.datasets import ImageCache

PRESET = "tiny"


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
    stage2_lr: float = 5e-4
    val_every: int = 0
    val_pairs: int = 100
    max_test_pairs: int | None = None
    stage1_pairs: int | None = None  # stage 1 pre-trains on the procedures of the first N training pairs


QUICK = DemoBudget(
    scenes=40,
    vqgan_steps=3,
    vqgan_batch=8,
    stage1_steps=6,
    stage1_batch=8,
    stage2_steps=16,
    stage2_batch=16,
    stage2_lr=1e-3,
    val_every=8,
    val_pairs=10,
    max_test_pairs=20,
    stage1_pairs=24,
)
FULL = DemoBudget(
    scenes=1000,
    vqgan_steps=40,
    vqgan_batch=16,
    stage1_steps=150,
    stage1_batch=16,
    stage2_steps=900,
    stage2_batch=16,
    stage2_lr=5e-4,
    val_every=150,
    val_pairs=100,
    stage1_pairs=480,
)


class Clock:
    """Wall-clock per phase, printed as the demo goes."""

    def __init__(self, verbose: bool = True) -> None:
        self.start, self.phases, self.verbose = time.perf_counter(), {}, verbose

    def phase(self, name: str, message: str) -> None:
        self._t = time.perf_counter()
        self._name = name
        if self.verbose:
            print(f"[{time.perf_counter() - self.start:6.1f}s] {message}", flush=True)

    def done(self) -> float:
        seconds = time.perf_counter() - self._t
        self.phases[self._name] = round(seconds, 2)
        return seconds

    @property
    def total(self) -> float:
        return time.perf_counter() - self.start


def ensure_benchmark(root: Path, scenes: int, seed: int, progress: bool) -> None:
    """Generate the synthetic benchmark unless ``root`` already holds the same one (same scenes, size, seed)."""
    from procap.data.synthetic import generate

    spec = root / "scenes.json"
    if spec.is_file():
        try:
            meta = json.loads(spec.read_text(encoding="utf-8"))
            if len(meta["scenes"]) == scenes and meta["size"] == 64 and meta["seed"] == seed:
                return
        except (ValueError, KeyError, TypeError):
            pass
    generate(root, scenes, size=64, seed=seed, progress=progress)


def stage_configs(
    budget: DemoBudget, out: Path, data: Path, seed: int, device: str, progress: bool, workers: int
) -> dict[str, TrainConfig]:
    """The TrainConfig of every training run in the demo."""
    common: dict[str, Any] = {
        "preset": PRESET,
        "data": str(data),
        "dataset": "clevr-change",
        "seed": seed,
        "device": device,
        "workers": workers,
        "progress": progress,
        "log_every": 5,
        "decay": "cosine",
        "cache_features": True,
    }
    vqgan = TrainConfig(
        stage="vqgan",
        out=str(out / "vqgan"),
        steps=budget.vqgan_steps,
        lr=budget.vqgan_lr,
        batch_size=budget.vqgan_batch,
        warmup_steps=max(1, budget.vqgan_steps // 10),
        **{**common, "decay": "none"},
    )
    vq_path = str(out / "vqgan" / "vqgan.safetensors")
    stage1 = TrainConfig(
        stage="pretrain",
        out=str(out / "stage1"),
        steps=budget.stage1_steps,
        lr=budget.stage1_lr,
        lr_start=1e-6,
        batch_size=budget.stage1_batch,
        warmup_steps=max(1, budget.stage1_steps // 10),
        vqgan=vq_path,
        procedures="crossfade",
        **common,
    )
    stage2 = {
        "steps": budget.stage2_steps,
        "lr": budget.stage2_lr,
        "batch_size": budget.stage2_batch,
        "warmup_frac": 0.1,
        "val_every": budget.val_every,
        "val_pairs": budget.val_pairs,
        **common,
    }
    procap = TrainConfig(
        stage="train", out=str(out / "procap"), init=str(out / "stage1" / "stage1.safetensors"), **stage2
    )
    static = TrainConfig(stage="train", out=str(out / "static"), num_keyframes=0, vqgan=vq_path, **stage2)
    return {"vqgan": vqgan, "stage1": stage1, "procap": procap, "static": static}


def build_procedures(
    kind: str, data: Path, out: Path, pairs: list, vqgan_path: str, progress: bool, workers: int = 1
) -> str:
    """The stage-1 frame source for the demo, as a ``--procedures`` value.

    ``crossfade``: the linear cross-fade stand-in, no preparation. ``interpolated``: the real pipeline of
    ``procap.procedure`` (optical-flow interpolation of l = 7 frames, VQGAN-similarity confidence scores,
    top-k keyframes) written to ``<out>/procedures`` and read back through its ``CachedProcedures``.
    """
    if kind == "crossfade":
        return "crossfade"
    from procap.procedure.pipeline import PrepareOptions, prepare

    cache = out / "procedures"
    # Stage 1 computes its MSM targets from the frames itself, so the cache skips the per-frame VQ codes.
    prepare(
        PrepareOptions(
            dataset="clevr-change",
            root=str(data),
            out=str(cache),
            image_size=64,
            vqgan=vqgan_path,
            store_codes=False,
            workers=max(1, workers),
            progress=progress,
        ),
        pairs=pairs,
    )
    return str(cache)


def evaluate_run(
    name: str, checkpoint: Path, pairs: list, metrics, cache: ImageCache, device: str, out: Path
) -> dict[str, Any]:
    from procap.checkpoint import load_checkpoint
    from procap.train.evaluation import evaluate_model

    model, vocab, meta = load_checkpoint(checkpoint, map_location=device)
    report = evaluate_model(
        model,
        vocab,
        pairs,
        metrics,
        batch_size=32,
        device=device,
        cache=cache,
        out=out / name,
        extra={
            "checkpoint": str(checkpoint),
            "selected_at_step": meta["extra"].get("step"),
            "num_keyframes": model.config.num_keyframes,
        },
    )
    return report


def format_table(reports: dict[str, dict], metrics) -> str:
    """BLEU-4 / METEOR / ROUGE-L / CIDEr rows for ProCap and the static-pair baseline."""
    head = f"{'model':<24}" + "".join(f"{m:>9}" for m in metrics) + f"{'capt/s':>9}{'tok/s':>9}"
    lines = [head, "-" * len(head)]
    for label, report in reports.items():
        cells = "".join(f"{report['metrics'].get(m, float('nan')):9.2f}" for m in metrics)
        speed = report["speed"]
        lines.append(f"{label:<24}{cells}{speed['captions_per_s']:9.1f}{speed['tokens_per_s']:9.0f}")
    return "\n".join(lines)


def pick_samples(pairs: list, count: int) -> list:
    """One test pair per change type (then more), so the examples show every kind of change."""
    by_type: dict[str, list] = {}
    for pair in pairs:
        by_type.setdefault(pair.change_type or "pair", []).append(pair)
    chosen, depth = [], 0
    while len(chosen) < min(count, len(pairs)):
        for members in by_type.values():
            if depth < len(members) and len(chosen) < count:
                chosen.append(members[depth])
        depth += 1
    return chosen


def write_samples(samples: list, reports: dict[str, dict], cache: ImageCache, out: Path) -> list[dict[str, Any]]:
    """samples.json and a before|after PNG per example under ``out/samples``."""
    from PIL import Image

    from procap.train.common import write_json

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
    write_json(out / "samples.json", rows)
    return rows


def run_demo(
    out: Path | str,
    quick: bool = False,
    seed: int = 0,
    device: str = "cpu",
    workers: int = 0,
    progress: bool = True,
    budget: DemoBudget | None = None,
    procedures: str = "interpolated",
) -> dict[str, Any]:
    """Run the demo end to end and return what it writes to ``<out>/metrics.json``."""
    from procap.data import load_split
    from procap.train.common import build_vocab, write_json
    from procap.train.evaluation import default_metrics
    from procap.train.stage1 import pretrain
    from procap.train.stage2 import train
    from procap.train.vqgan_train import train_vqgan

    out, budget = Path(out), budget or (QUICK if quick else FULL)
    clock, data = Clock(), Path(out) / "data"
    clock.phase("data", f"synthetic CLEVR-Change benchmark: {budget.scenes} scenes at 64 px -> {data}")
    ensure_benchmark(data, budget.scenes, seed, progress)
    splits = {s: load_split("clevr-change", data, s) for s in ("train", "val", "test")}
    test = splits["test"][: budget.max_test_pairs] if budget.max_test_pairs else splits["test"]
    vocab = build_vocab(splits["train"], "clevr-change")
    cache = ImageCache(64)
    clock.done()
    configs = stage_configs(budget, out, data, seed, device, progress, workers)
    print(
        f"         pairs: {len(splits['train'])} train / {len(splits['val'])} val / {len(test)} test, "
        f"vocabulary {len(vocab)} words",
        flush=True,
    )

    clock.phase("vqgan", f"VQGAN ({PRESET} preset tokenizer): {budget.vqgan_steps} steps")
    train_vqgan(configs["vqgan"], pairs=splits["train"])
    clock.done()
    clock.phase("procedures", f"stage-1 procedures: {procedures}")
    # CLEVR-Change pairs alternate change / distractor, so any prefix is balanced.
    stage1_pairs = splits["train"][: budget.stage1_pairs] if budget.stage1_pairs else splits["train"]
    source = build_procedures(
        procedures,
        data,
        out,
        stage1_pairs,
        configs["stage1"].vqgan,
        progress,
        workers=max(1, min(2, torch.get_num_threads())),
    )
    configs["stage1"] = dataclasses.replace(configs["stage1"], procedures=source)
    clock.done()
    clock.phase(
        "stage1", f"stage 1 (explicit procedures, {procedures}): {budget.stage1_steps} steps x {budget.stage1_batch}"
    )
    pretrain(configs["stage1"], pairs=stage1_pairs, vocab=vocab, cache=cache)
    clock.done()
    best = {}
    for name, label in (("procap", "ProCap (k=2)"), ("static", "static pair (k=0)")):
        clock.phase(name, f"stage 2, {label}: {budget.stage2_steps} steps x {budget.stage2_batch}")
        best[name] = train(configs[name], pairs=splits["train"], val_pairs=splits["val"], vocab=vocab, cache=cache)
        clock.done()

    metrics, note = default_metrics()
    clock.phase("evaluate", f"evaluation on {len(test)} test pairs")
    reports = {
        label: evaluate_run(name, best[name], test, metrics, cache, device, out)
        for name, label in (("procap", "ProCap (k=2)"), ("static", "static pair (k=0)"))
    }
    samples = write_samples(pick_samples(test, 6), reports, cache, out)
    clock.done()

    summary = {
        "quick": quick,
        "seed": seed,
        "procedures": procedures,
        "budget": dataclasses.asdict(budget),
        "device": device,
        "threads": torch.get_num_threads(),
        "pairs": {"train": len(splits["train"]), "val": len(splits["val"]), "test": len(test)},
        "results": {label: {k: v for k, v in r.items() if k != "predictions"} for label, r in reports.items()},
        "phases_s": clock.phases,
        "total_s": round(clock.total, 1),
        "note": note,
    }
    write_json(out / "metrics.json", summary)
    print_summary(reports, metrics, samples, summary, note)
    return summary


def print_summary(reports: dict, metrics, samples: list, summary: dict, note: str | None) -> None:
    print()
    print(format_table(reports, metrics))
    if note:
        print(note)
    print("\nexamples (test split):")
    for row in samples:
        print(f"  {row['id']} [{row['change_type']}]")
        for label in reports:
            print(f"    {label:<18} {row[label]}")
        print(f"    {'reference':<18} {row['references'][0]}")
    print(
        f"\ntotal {summary['total_s']:.0f} s on {summary['threads']} threads; phases: "
        + ", ".join(f"{k} {v:.0f}s" for k, v in summary["phases_s"].items())
    )
