"""Checks of a demo ``report.html`` shared by tests/viz/test_report.py and tests/test_demo.py."""

from __future__ import annotations

import base64
import io
from html.parser import HTMLParser
from pathlib import Path

from PIL import Image

PNG_PREFIX = "data:image/png;base64,"
SECTIONS = ("about", "budget", "metrics", "paired", "per-type", "curves", "examples", "procedure")


class _Collector(HTMLParser):
    """Every <img> src, every id, every external reference (link/script/src not data:) and the text."""

    def __init__(self) -> None:
        super().__init__()
        self.images: list[str] = []
        self.ids: set[str] = set()
        self.external: list[str] = []
        self.text: list[str] = []
        self.open_tags: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if values.get("id"):
            self.ids.add(values["id"])
        if tag == "img":
            self.images.append(values.get("src") or "")
        if tag in ("link", "script", "iframe") or (tag != "img" and values.get("src")):
            self.external.append(f"<{tag} {values}>")
        if tag not in ("img", "meta", "br", "link"):
            self.open_tags.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if tag in self.open_tags:
            while self.open_tags.pop() != tag:
                pass

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def check_report_html(path: Path, change_types: set[str]) -> dict:
    """Parse ``path`` and assert it is a self-contained report; returns what was found.

    Asserts: it parses with every tag closed, every <img> is a base64 PNG data URI that decodes to a valid PNG,
    nothing is loaded from elsewhere, the opening paragraph and the budget / metrics / paired / per-type / curves /
    examples / stage-1 procedure sections are present, and there is one example per change type in ``change_types``.
    """
    collector = _Collector()
    collector.feed(path.read_text(encoding="utf-8"))
    collector.close()
    assert collector.open_tags == [], f"unclosed tags {collector.open_tags}"
    assert collector.external == [], collector.external
    assert collector.images, "no images"
    sizes = []
    for src in collector.images:
        assert src.startswith(PNG_PREFIX), src[:60]
        data = base64.b64decode(src[len(PNG_PREFIX) :], validate=True)
        with Image.open(io.BytesIO(data)) as image:
            assert image.format == "PNG"
            image.verify()  # checksums and structure
        with Image.open(io.BytesIO(data)) as image:
            image.load()
            sizes.append(image.size)
    for section in SECTIONS:
        assert section in collector.ids, f"section {section} missing"
    for kind in change_types:
        assert f"example-{kind}" in collector.ids, f"no example of {kind}"
    return {"images": sizes, "ids": collector.ids, "text": " ".join(collector.text)}


# ---------------------------------------------------------------------------------------------- a fake demo folder
LABELS = ("ProCap (k=2)", "ProCap, no stage 1 (k=2)", "stage 1, static pair (k=0)", "static pair (k=0)")
RUN_FOLDERS = ("procap", "procap_no_stage1", "stage1_static", "static")
FAKE_TYPES = ("move", "no_change", "add")


# the quick demo's budget (procap/experiments/demo.py QUICK) with a tokenizer step count found nowhere else
FAKE_BUDGET = {
    "scenes": 800,
    "vqgan_steps": 123,
    "vqgan_batch": 16,
    "stage1_steps": 10,
    "stage1_batch": 8,
    "stage2_steps": 600,
    "stage2_batch": 32,
    "vqgan_lr": 0.001,
    "stage1_lr": 0.0005,
    "stage2_lr": 0.001,
    "val_every": 300,
    "val_pairs": 40,
    "max_test_pairs": 6,
    "stage1_pairs": 24,
    "stage2_encoder_lr": None,
    "viewpoint": "none",
    "select_metric": "correctness",
}


def _result(offset: float) -> dict:
    metrics = {"BLEU-4": 40.0 + offset, "METEOR": 30.0, "ROUGE-L": 70.0, "CIDEr": 150.0 + offset}
    per_type = {kind: {"change": 0.9, "type": 0.5, "pairs": 2, "change_pairs": 2} for kind in FAKE_TYPES}
    per_type["no_change"] = {"change": 0.5, "type": None, "pairs": 2, "change_pairs": 0}  # distractors: no type
    accuracy = {
        "change": 0.95,
        "type": 0.55,
        "object": 0.05,
        "new_value": 0.1,
        "distinct": 0.4,
        "per_type": per_type,
        "pairs": 6,
        "change_pairs": 4,
        "distractor_pairs": 2,
    }
    by_type = {kind: {**metrics, "CIDEr": 100.0 + offset, "pairs": 2} for kind in FAKE_TYPES}
    by_type["change"] = {**metrics, "CIDEr": 110.0 + offset, "pairs": 4}  # every change pair, as the demo writes
    by_type["total"] = {**metrics, "pairs": 6}
    return {
        "checkpoint_step": 1234,
        "checkpoint_stage": "stage2",
        "num_keyframes": 2,
        "pairs": 6,
        "by_type": by_type,
        "metrics": metrics,
        "metrics_std": {m: 0.0 for m in metrics},
        "accuracy": accuracy,
        "accuracy_std": {k: 0.0 for k in ("change", "type", "object", "new_value", "distinct")},
        "seeds": [{"seed": 0, "metrics": metrics, "accuracy": {"type": 0.5}}],
    }


def fake_paired(seeds: int = 1) -> list[dict]:
    """metrics.json's ``paired`` rows (procap.experiments.demo.paired_comparisons) for ``seeds`` seeds: ProCap
    minus each other model, then the interaction; the interval over seeds only from two seeds on."""
    rows = []
    for index, baseline in enumerate((LABELS[3], LABELS[2], LABELS[1], "2x2 interaction")):
        for figure, pairs in (("change", 6), ("type", 4), ("object", 4)):
            difference = 0.01 * (index + 1)
            row = {"model": LABELS[0], "baseline": baseline, "figure": figure, "pairs": pairs, "seeds": seeds}
            row |= {"difference": difference, "low": difference - 0.2, "high": difference + 0.3, "level": 0.95}
            row["per_seed"] = [difference + 0.01 * s for s in range(seeds)]
            row["seed_low"] = difference - 0.04 if seeds > 1 else None
            row["seed_high"] = difference + 0.05 if seeds > 1 else None
            if baseline != "2x2 interaction":
                row |= {"model_accuracy": 0.5 + difference, "baseline_accuracy": 0.5}
            rows.append(row)
    return rows


def make_fake_demo(folder: Path, checkpoint: Path | None = None, size: int = 64) -> Path:
    """A demo output folder with metrics.json, samples.json, samples/*.png and log.jsonl files (no training).

    ``checkpoint`` (a ProCap ``.safetensors``) is copied to ``procap/best.safetensors`` when given.
    """
    import json
    import shutil

    import numpy as np

    folder.mkdir(parents=True, exist_ok=True)
    results = {label: _result(float(i)) for i, label in enumerate(LABELS)}
    summary = {
        "quick": True,
        "seed": 0,
        "seeds": [0],
        "procedures": "interpolated",
        "viewpoint": "none",
        "tokenizer": "embedded (demo_tokenizer.safetensors)",
        "budget": FAKE_BUDGET,
        "device": "cpu",
        "total_s": 60.0,
        "pairs": {"train": 1280, "val": 160, "test": 6},
        "results": results,
        "paired": fake_paired(),
    }
    (folder / "metrics.json").write_text(json.dumps(summary), encoding="utf-8")
    (folder / "samples").mkdir(exist_ok=True)
    rng = np.random.default_rng(0)
    rows = []
    for index, kind in enumerate((*FAKE_TYPES, "move")):  # a second move: the report shows one per type
        name = f"CLEVR_semantic_{index:06d}"
        pixels = rng.integers(0, 256, size=(size, 2 * size, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / "samples" / f"{name}.png")
        captions = {label: f"caption {index} of {label} <b>&" for label in LABELS}
        rows.append({"id": f"{name}.png", "change_type": kind, "image": f"samples/{name}.png", **captions})
        rows[-1]["references"] = [f"reference {index} a", f"reference {index} b"]
    (folder / "samples.json").write_text(json.dumps(rows), encoding="utf-8")
    for run in (*RUN_FOLDERS, "stage1"):
        (folder / run).mkdir(exist_ok=True)
        records = [{"step": s, "loss": 4.0 / s} for s in range(1, 21)]
        if run == "stage1":  # an alignment loss at chance (2 ln 2), as the demo's short stage 1 leaves it
            records = [
                {**r, "align": 1.386 + 0.002 * (-1) ** r["step"], "align_acc": 0.5, "msm_acc": 0.05} for r in records
            ]
        else:
            records += [{"step": s, "val/CIDEr": 100.0 + s} for s in (10, 20)]
            init = str(folder / "stage1" / "stage1.safetensors") if run in ("procap", "stage1_static") else None
            (folder / run / "stage2_config.json").write_text(json.dumps({"init": init}), encoding="utf-8")
        text = "\n".join(json.dumps(r) for r in records) + "\n{torn"
        (folder / run / "log.jsonl").write_text(text, encoding="utf-8")
    if checkpoint is not None:
        shutil.copy(checkpoint, folder / "procap" / "best.safetensors")
    return folder
