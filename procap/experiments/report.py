"""``report.html``: one self-contained page summarising a ``procap demo`` output folder.

:func:`build_report` reads what the demo wrote (``metrics.json``, ``samples.json`` with ``samples/*.png``, every
run's ``log.jsonl`` and the ProCap checkpoint) and writes ``<folder>/report.html`` with

- the metrics table of the four models of the 2 x 2 ablation (caption metrics, correctness accuracy and the
  failure kinds, mean +- std over seeds),
- the per-change-type breakdown (CIDEr and type accuracy),
- training curves drawn with matplotlib (Agg, no display): stage-1 loss, stage-2 loss and validation CIDEr,
- one test pair per change type: before / after, each model's caption, the references and the procedure the
  ProCap checkpoint imagines (:func:`procap.viz.figures.imagine`),
- the explicit procedure of one stage-1 training pair from the demo's procedure cache
  (:func:`procap.viz.figures.explicit_procedure`: interpolated frames, confidence bars, sampled keyframes).

Every image is embedded as a ``data:image/png;base64`` URI and the style sheet is inline: the file opens offline,
and can be mailed or archived alone. The page is written atomically (temporary file + rename).
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
from pathlib import Path
from typing import Any

from PIL import Image

from procap.core.errors import ProCapError
from procap.core.files import atomic_write_text
from procap.core.json_files import read_json as read_json_file
from procap.core.json_files import read_json_lines
from procap.data import load_split
from procap.data.images import open_image
from procap.eval.correctness import FAILURE_COLUMNS
from procap.loading.checkpoint import load_checkpoint
from procap.viz.figures import (
    check_imaginable,
    explicit_procedure,
    flat_scores_note,
    head_note,
    imagine,
    procedure_from_cache,
)

REPORT_NAME = "report.html"
RUNS = (  # folder under the demo output, label in metrics.json (procap/experiments/demo.py MODELS)
    ("procap", "ProCap (k=2)"),
    ("procap_no_stage1", "ProCap, no stage 1 (k=2)"),
    ("stage1_static", "stage 1, static pair (k=0)"),
    ("static", "static pair (k=0)"),
)
STAGE1_NOTE = (
    "What stage 1 trains on: the interpolated frames of a training pair, a bar per frame for its confidence score, "
    "the sampled keyframes outlined in red (<code>procap procedure</code> draws any cached pair)."
)
ACCURACY_COLUMNS = ("change", "type", "object", "distinct")
STYLE = """
body { font-family: sans-serif; margin: 2em; color: #222; max-width: 1400px; }
table { border-collapse: collapse; margin: 1em 0; }
th, td { border: 1px solid #bbb; padding: 4px 8px; text-align: right; }
th:first-child, td:first-child, .text { text-align: left; }
.example { border-top: 1px solid #ccc; padding: 1em 0; }
.pair img { margin-right: 8px; image-rendering: pixelated; }
.caption-model { font-weight: bold; }
.note { color: #555; font-size: 90%; }
"""


def png_data_uri(image: Image.Image | bytes) -> str:
    """A ``data:image/png;base64,...`` URI of a PIL image (saved as PNG) or of PNG bytes."""
    if isinstance(image, Image.Image):
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        image = buffer.getvalue()
    return "data:image/png;base64," + base64.b64encode(image).decode("ascii")


def img_tag(image: Image.Image | bytes, alt: str, width: int | None = None) -> str:
    size = f' width="{width}"' if width else ""
    return f'<img src="{png_data_uri(image)}" alt="{html.escape(alt)}"{size}>'


def read_json(path: Path, what: str) -> Any:
    """Parsed JSON, or a one-sentence :class:`ProCapError` naming the file."""
    if not path.is_file():
        raise ProCapError(f"{what} {path} does not exist; is this a `procap demo` output folder?")
    return read_json_file(path, what)


def read_log(path: Path) -> list[dict[str, Any]]:
    """The records of a training ``log.jsonl`` (an absent file or a torn last line gives what could be read)."""
    return read_json_lines(path, "log", partial=True)


def _cell(mean: float | None, std: float | None, seeds: int, scale: float = 1.0) -> str:
    if mean is None:
        return "n/a"
    text = f"{scale * mean:.1f}"
    return text + (f" ± {scale * (std or 0.0):.1f}" if seeds > 1 else "")


def metrics_table(summary: dict[str, Any]) -> str:
    """HTML table: one row per model, caption metrics (x100) and correctness accuracy (%)."""
    results = summary["results"]
    first = next(iter(results.values()))
    metrics = list(first["metrics"])
    seeds = len(first.get("seeds", [])) or 1
    titles = [*metrics, *ACCURACY_COLUMNS, *(title for _, title, _ in FAILURE_COLUMNS), "selected at step"]
    head = "".join(f"<th>{html.escape(c)}</th>" for c in ["model", *titles])
    rows = []
    for label, report in results.items():
        cells = [_cell(report["metrics"][m], report.get("metrics_std", {}).get(m), seeds) for m in metrics]
        accuracy, accuracy_std = report.get("accuracy", {}), report.get("accuracy_std", {})
        cells += [_cell(accuracy.get(c), accuracy_std.get(c), seeds, 100.0) for c in ACCURACY_COLUMNS]
        for key, _, kind in FAILURE_COLUMNS:
            cells.append(_cell(accuracy.get(key), accuracy_std.get(key), seeds, 100.0 if kind == "fraction" else 1.0))
        cells.append(str(report.get("checkpoint_step", "")))
        rows.append(f"<tr><td>{html.escape(label)}</td>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    note = (
        f"Test split, {summary.get('pairs', {}).get('test', '?')} pairs; {seeds} seed{'s' if seeds > 1 else ''}. "
        "Caption metrics x100; change / type / object / distinct: correctness accuracy in %; miss (change pairs "
        "captioned 'no change'), false pos. (distractors captioned with a change) and move as add/drop in %; "
        "unparsed: change pairs whose caption the grammar cannot read (counted wrong)."
    )
    return f"<table><tr>{head}</tr>{''.join(rows)}</table><p class='note'>{html.escape(note)}</p>"


def per_type_table(summary: dict[str, Any]) -> str:
    """HTML table: one row per change type, CIDEr and type accuracy (%) of every model (the first seed's)."""
    results = summary["results"]
    types = list(next(iter(results.values()))["by_type"])
    head = "<th>change type</th><th>pairs</th>"
    head += "".join(f"<th>CIDEr<br>{html.escape(label)}</th>" for label in results)
    head += "".join(f"<th>type acc. %<br>{html.escape(label)}</th>" for label in results)
    rows = []
    for kind in types:
        scores = [r["by_type"].get(kind, {}) for r in results.values()]
        cider = [f"{s['CIDEr']:.1f}" if "CIDEr" in s else "n/a" for s in scores]
        per_type = [r.get("accuracy", {}).get("per_type", {}).get(kind, {}) for r in results.values()]
        type_acc = [f"{100 * a['type']:.1f}" if a.get("type") is not None else "n/a" for a in per_type]
        cells = [str(scores[0].get("pairs", "")), *cider, *type_acc]
        rows.append(f"<tr><td>{html.escape(kind)}</td>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    note = "Test split, the first seed's run; type acc.: the caption names the right kind of change."
    return f"<table><tr>{head}</tr>{''.join(rows)}</table><p class='note'>{note}</p>"


def curves_png(folder: Path) -> bytes | None:
    """PNG of :func:`curves_figure`, None without logs."""
    figure = curves_figure(folder)
    if figure is None:
        return None
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()


def curves_figure(folder: Path) -> Any:
    """The training curves (stage-1 loss, stage-2 loss, validation CIDEr against steps), None without logs.

    Losses are drawn on a log scale, each model with its own line style and markers: the four stage-2 losses
    differ by a few percent and, on a linear scale, lay on top of one another.
    """
    from matplotlib.figure import Figure  # Figure + savefig use the Agg renderer: no display, no pyplot state

    logs = {label: read_log(folder / name / "log.jsonl") for name, label in RUNS}
    stage1 = read_log(folder / "stage1" / "log.jsonl")
    if not stage1 and not any(logs.values()):
        return None
    figure = Figure(figsize=(13, 3.6), dpi=90)
    loss1, loss2, cider = figure.subplots(1, 3)
    _plot(loss1, {"stage 1 (ProCap)": stage1}, "loss", "stage-1 loss (MSM + align + csy)", log_scale=True)
    _plot(loss2, logs, "loss", "stage-2 training loss", log_scale=True)
    _plot(cider, logs, "val/CIDEr", "validation CIDEr")
    figure.tight_layout()
    return figure


# (line, marker, marker size, filled) per model: hollow markers of falling size nest where the curves coincide.
LINE_STYLES = (("-", "o", 8, False), ("--", "s", 5.5, False), ("-.", "D", 4.5, False), (":", "^", 4, True))


def _minor_log_label(value: float, _position: int) -> str:
    """Labels for the 2, 3 and 5 ticks of each decade of a log axis (a loss spans a decade or two)."""
    leading = round(value / 10 ** math.floor(math.log10(value))) if value > 0 else 0
    return f"{value:g}" if leading in (2, 3, 5) else ""


def _plot(axes: Any, logs: dict[str, list[dict]], key: str, title: str, log_scale: bool = False) -> None:
    from matplotlib.ticker import FuncFormatter

    for (label, records), (line, marker, size, filled) in zip(logs.items(), LINE_STYLES):
        points = [(r["step"], r[key]) for r in records if key in r and "step" in r]
        if points:
            steps, values = zip(*points)
            drawn = axes.plot(steps, values, label=label, linestyle=line, marker=marker, markersize=size)
            drawn[0].set_markevery(max(1, len(points) // 12))  # about a dozen markers per curve, however long the run
            if not filled:
                drawn[0].set_markerfacecolor("none")
    axes.set_title(title)
    axes.set_xlabel("step")
    values = [v for line in axes.lines for v in line.get_ydata()]
    if log_scale and values and min(values) > 0:
        axes.set_yscale("log")
        axes.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))  # 0.3, not 3 x 10^-1
        axes.yaxis.set_minor_formatter(FuncFormatter(_minor_log_label))
    if axes.lines:
        axes.legend(fontsize=8)
    else:
        axes.text(0.5, 0.5, "no records", ha="center", va="center", transform=axes.transAxes)


def example_rows(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The first sample of every change type, in the order they appear."""
    chosen: dict[str, dict[str, Any]] = {}
    for row in samples:
        chosen.setdefault(row.get("change_type") or "pair", row)
    return list(chosen.values())


def split_pair_image(path: Path) -> tuple[Image.Image, Image.Image]:
    """The demo's sample PNG is before | after side by side: the two halves."""
    with open_image(path) as image:
        image = image.convert("RGB")
    half = image.width // 2
    return image.crop((0, 0, half, image.height)), image.crop((half, 0, 2 * half, image.height))


class Imaginer:
    """Loads the ProCap checkpoint once and imagines the procedure of a before/after pair (None if it cannot)."""

    def __init__(self, checkpoint: Path | None) -> None:
        self.model = self.vocab = self.stage = None
        self.note = (
            "not drawn (imagine_procedures=False)" if checkpoint is None else f"no ProCap checkpoint at {checkpoint}"
        )
        if checkpoint is not None and checkpoint.is_file():
            self.model, self.vocab, meta = load_checkpoint(checkpoint, map_location="cpu")
            self.stage = meta.get("extra", {}).get("stage")
            try:
                check_imaginable(self.model)
                self.note = head_note(self.stage)
            except ProCapError as exc:
                self.model, self.note = None, str(exc)

    def __call__(self, before: Image.Image, after: Image.Image) -> Image.Image | None:
        if self.model is None:
            return None

        size = self.model.config.image_size
        before_t, after_t = (image_tensor(image, size) for image in (before, after))
        return imagine(self.model, before_t, after_t, vocab=self.vocab, stage=self.stage).strip


def image_tensor(image: Image.Image, size: int):
    """RGB PIL image -> (3, size, size) float32 tensor in [0, 1] (bicubic resize only when the size differs)."""
    import numpy as np
    import torch

    if image.size != (size, size):
        image = image.resize((size, size), Image.BICUBIC)
    return torch.from_numpy(np.asarray(image, dtype=np.float32) / 255.0).permute(2, 0, 1).contiguous()


def example_html(folder: Path, row: dict[str, Any], labels: list[str], imaginer: Imaginer) -> str:
    """One example: before / after, each model's caption, the references and the imagined procedure strip."""
    before, after = split_pair_image(folder / row["image"])
    scale = max(1, 128 // max(1, before.width))  # the demo's 64 px images shown at 128 px
    width = before.width * scale
    kind = row.get("change_type") or "pair"
    parts = [
        f"<div class='example' id='example-{html.escape(kind)}'>",
        f"<h3>{html.escape(kind)}: {html.escape(str(row['id']))}</h3>",
        f"<div class='pair'>{img_tag(before, 'before', width)}{img_tag(after, 'after', width)}</div>",
        "<table><tr><th>model</th><th class='text'>caption</th></tr>",
    ]
    for label in labels:
        caption = html.escape(str(row.get(label, "n/a")))
        parts.append(f"<tr><td class='caption-model'>{html.escape(label)}</td><td class='text'>{caption}</td></tr>")
    parts.append("</table><p>references: " + "; ".join(html.escape(r) for r in row.get("references", [])) + "</p>")
    strip = imaginer(before, after)
    if strip is not None:
        parts.append(f"<p>imagined procedure (ProCap checkpoint):</p>{img_tag(strip, 'imagined procedure')}")
    else:
        parts.append(f"<p class='note'>no imagined procedure: {html.escape(imaginer.note)}</p>")
    parts.append("</div>")
    return "\n".join(parts)


def stage1_procedure_html(folder: Path, num_keyframes: int = 2) -> str:
    """The explicit procedure of the first cached training pair (a "move" pair when there is one), or a note."""
    cache_dir, data = folder / "procedures", folder / "data"
    if not cache_dir.is_dir() or not data.is_dir():
        return (
            "<p class='note'>no procedure cache (the demo ran with --procedures crossfade or truth, or this is not "
            "a demo)</p>"
        )
    from procap.procedure import ProcedureCache  # h5py (the [train] extra): only a demo folder with a cache needs it

    try:
        cache = ProcedureCache(cache_dir)
    except ProCapError as exc:  # an empty or foreign folder: the report still shows everything else
        return f"<p class='note'>{html.escape(str(exc))}</p>"
    try:
        pairs = load_split("clevr-change", data, "train")
        ordered = [p for p in pairs if p.change_type == "move"] + pairs
        for pair in ordered:
            try:
                frames, s_bef, s_aft = procedure_from_cache(cache, pair.id)
            except ProCapError:
                continue
            caption = f"{pair.id} ({pair.change_type}): {pair.captions[0] if pair.captions else ''}"
            result = explicit_procedure(frames, s_bef, s_aft, num_keyframes, caption=caption)
            scores = ", ".join(f"{w:.4f}" for w in result.weights.tolist())
            keys = ", ".join(f"P{i}" for i in result.keyframes.tolist())
            note = f"{pair.id} ({pair.change_type}): confidence of P1..P{len(result.weights)}: {scores}; "
            note += f"keyframes (top-{num_keyframes}): {keys}"
            note += f". Note: {flat_scores_note(result.weights)}." if flat_scores_note(result.weights) else ""
            return f"{img_tag(result.strip, 'explicit procedure')}<p class='note'>{html.escape(note)}</p>"
    finally:
        cache.close()
    return "<p class='note'>the procedure cache holds none of the training pairs</p>"


def run_line(summary: dict[str, Any]) -> str:
    """One line on the run: quick or full, device, total time, pair counts, budget."""
    kind = "quick" if summary.get("quick") else "full"
    return (
        f"{kind} demo on {summary.get('device', '?')}, {summary.get('total_s', '?')} s in total; "
        f"pairs {json.dumps(summary.get('pairs', {}))}; budget {json.dumps(summary.get('budget', {}))}"
    )


def report_html(folder: Path, imagine_procedures: bool = True) -> str:
    """The page for the demo output ``folder`` (see the module docstring)."""
    summary = read_json(folder / "metrics.json", "demo metrics")
    if not isinstance(summary, dict) or not isinstance(summary.get("results"), dict) or not summary["results"]:
        raise ProCapError(f"demo metrics {folder / 'metrics.json'} holds no results.")
    samples = read_json(folder / "samples.json", "demo samples")
    labels = list(summary["results"])
    imaginer = Imaginer(folder / "procap" / "best.safetensors" if imagine_procedures else None)
    curves = curves_png(folder)
    body = [
        "<h1>ProCap demo report</h1>",
        f"<p class='note'>{html.escape(run_line(summary))}</p>",
        "<h2 id='metrics'>Metrics</h2>",
        metrics_table(summary),
        "<h2 id='per-type'>Per change type</h2>",
        per_type_table(summary),
        "<h2 id='curves'>Training curves</h2>",
        img_tag(curves, "training curves") if curves else "<p class='note'>no training logs found</p>",
        "<h2 id='examples'>Examples (test split, one per change type)</h2>",
        f"<p class='note'>imagined procedures: {html.escape(imaginer.note)}</p>",
        *(example_html(folder, row, labels, imaginer) for row in example_rows(samples)),
        "<h2 id='procedure'>A stage-1 training procedure (explicit)</h2>",
        f"<p class='note'>{STAGE1_NOTE}</p>",
        stage1_procedure_html(folder),
    ]
    head = f"<head><meta charset='utf-8'><title>ProCap demo report</title><style>{STYLE}</style></head>"
    return f"<!DOCTYPE html>\n<html>{head}<body>\n" + "\n".join(body) + "\n</body></html>\n"


def build_report(folder: str | Path, imagine_procedures: bool = True) -> Path:
    """Write ``<folder>/report.html`` for a ``procap demo`` output folder and return its path.

    Args:
        folder: the demo's ``--out`` folder (metrics.json, samples.json, samples/, <run>/log.jsonl, procap/).
        imagine_procedures: draw the ProCap checkpoint's imagined procedure under every example.

    Raises:
        ProCapError: metrics.json or samples.json is missing or unreadable (one sentence naming the file).
    """
    folder = Path(folder)
    return atomic_write_text(folder / REPORT_NAME, report_html(folder, imagine_procedures))
