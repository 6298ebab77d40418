"""``report.html``: one self-contained page summarising a ``procap demo`` output folder.

:func:`build_report` reads what the demo wrote (``metrics.json``, ``samples.json`` with ``samples/*.png``, every
run's ``log.jsonl`` and the ProCap checkpoint) and writes ``<folder>/report.html`` with

- one opening paragraph: what was trained, on what, how big the check is and how to read it,
- what was run as a table (only the parts that applied: no tokenizer steps when the embedded tokenizer was used),
- the metrics table of the four models of the 2 x 2 ablation (caption metrics, correctness accuracy and the
  failure kinds, mean +- std over seeds),
- the paired differences of ProCap against each other model, with their 95 % intervals over the test pairs and,
  from two seeds on, over the seeds,
- the per-change-type breakdown (CIDEr and type accuracy, each beside the number of pairs it comes from),
- training curves drawn with matplotlib (Agg, no display): stage-1 loss and alignment loss, stage-2 loss and
  validation CIDEr,
- one test pair per change type: before / after, each model's caption, the references and the procedure the
  ProCap checkpoint imagines (:func:`procap.viz.figures.imagine`), with a note on what its stage 1 learned,
- the explicit procedure of one stage-1 training pair from the demo's procedure cache
  (:func:`procap.viz.figures.explicit_procedure`: interpolated frames, confidence bars, sampled keyframes).

Every image is embedded as a ``data:image/png;base64`` URI and the style sheet is inline: the file opens offline,
and can be mailed or archived alone. The page is written atomically (temporary file + rename).
"""

from __future__ import annotations

import base64
import html
import io
import math
import statistics
from dataclasses import dataclass
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
RUNS = (  # folder under the demo output, label in metrics.json (procap/experiments/demo.py MODELS), what it is
    ("procap", "ProCap (k=2)", "stage 1's procedure modeling, then captioning with 2 procedure queries"),
    ("procap_no_stage1", "ProCap, no stage 1 (k=2)", "the same captioner trained from a random encoder"),
    ("stage1_static", "stage 1, static pair (k=0)", "stage 1, then captioning from the before and after images alone"),
    ("static", "static pair (k=0)", "neither: captioning from the two images alone"),
)
# Stage 1's alignment loss is the BCE of a positive and a negative caption per sample (procap.model.losses.pair_bce):
# a head that cannot tell them apart scores ln 2 on each.
ALIGN_CHANCE = 2 * math.log(2)
# How far below chance the mean of the last logged steps must be to count as learned: at chance one logged batch's
# alignment loss wanders by about 0.004 (the full demo's 400-step stage 1), so 0.02 is well clear of that noise.
ALIGN_MARGIN = 0.02
VIEWPOINT_TEXT = {  # procap.core.config.VIEWPOINTS, as docs/data.md describes them
    "none": "the camera stays put in change pairs, while distractors move the camera and light a little",
    "distractor": "change pairs and distractors alike move the camera and light a little, as in CLEVR-Change",
    "strong": "every pair moves the camera and light more than in CLEVR-Change",
}
PROCEDURE_TEXT = {  # procap.core.config.DEMO_PROCEDURES
    "interpolated": "optical-flow interpolated frames, keyframes sampled by confidence (a procedure cache)",
    "crossfade": "a cross-fade of the before and after images (a stand-in)",
    "truth": "the benchmark's exact intermediate frames",
}
# With fewer pairs than this behind a per-type figure, one caption moves it by more than 10 points.
FEW_PAIRS = 10
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
.few { color: #a33; }
#about { max-width: 70em; line-height: 1.45; }
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


def _first_result(summary: dict[str, Any]) -> dict[str, Any]:
    return next(iter(summary["results"].values()))


def _seed_count(summary: dict[str, Any]) -> int:
    return len(summary.get("seeds") or _first_result(summary).get("seeds") or [None])


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


# The last sentences of the report's opening paragraph: what each figure measures.
HOW_TO_READ = (
    "How to read it: <b>change</b> is the share of pairs whose caption rightly says whether something changed, "
    "<b>type</b> the share of change pairs whose caption names the kind of change, <b>object</b> the share whose "
    "caption names the changed object's size, colour, material and shape; <b>miss</b> is the share of change "
    "pairs captioned 'no change' and <b>false pos.</b> the share of distractors captioned with a change (lower "
    "is better); <b>CIDEr</b> scores the words against the reference captions (x100, not a percentage: on "
    "templated captions it passes 100)."
)


def about_html(summary: dict[str, Any], image_size: int | None = None) -> str:
    """The opening paragraph: what was trained, on what, how big the check is and how to read the figures.

    Every fact comes from ``metrics.json`` (a clause whose fact it lacks is left out); ``image_size`` is the side of
    the benchmark's images in pixels, when known.
    """
    parts = [_models_sentence(summary), _benchmark_sentence(summary, image_size), *_check_sentences(summary)]
    return "<p id='about'>" + " ".join([*parts, HOW_TO_READ]) + "</p>"


def _models_sentence(summary: dict[str, Any]) -> str:
    """``This page reports ... trained here: <the models>.``"""
    described = {label: text for _, label, text in RUNS}
    labels = list(summary["results"])
    models = [
        f"<b>{html.escape(label)}</b>" + (f" ({described[label]})" if label in described else "") for label in labels
    ]
    listed = ", ".join(models[:-1]) + f" and {models[-1]}" if len(models) > 1 else models[0]
    ablation = "the paper's 2 x 2 ablation, " if len(labels) == 4 else ""
    return f"This page reports {ablation}{_plural(len(labels), 'tiny ProCap captioner')} trained here: {listed}."


def _benchmark_sentence(summary: dict[str, Any], image_size: int | None) -> str:
    """The benchmark the models were trained on: its scenes, pairs, changes and viewpoint."""
    budget, pairs = summary.get("budget") or {}, summary.get("pairs") or {}
    accuracy = _first_result(summary).get("accuracy") or {}
    benchmark = "They were trained on the synthetic CLEVR-Change benchmark the demo generated"
    if budget.get("scenes"):
        size = f" at {image_size} px" if image_size else ""
        benchmark += f" ({budget['scenes']} scenes{size}"
        if "train" in pairs and "val" in pairs:
            benchmark += f"; {pairs['train']} training and {pairs['val']} validation pairs"
        benchmark += ")"
    types = [t for t in accuracy.get("per_type", {}) if t != "no_change"]
    benchmark += ": each scene gives a change pair"
    benchmark += f" (one change: {', '.join(types[:-1])} or {types[-1]})" if len(types) > 1 else ""
    benchmark += " and a distractor (only the camera or light moves, or nothing)"
    viewpoint = summary.get("viewpoint")
    if viewpoint:
        benchmark += f"; viewpoint <code>{html.escape(viewpoint)}</code>: {VIEWPOINT_TEXT.get(viewpoint, 'as named')}"
    return benchmark + "."


def _check_sentences(summary: dict[str, Any]) -> list[str]:
    """How large the check is (seeds, test pairs, what one caption moves) and so how far its figures carry."""
    parts = []
    pairs = summary.get("pairs") or {}
    accuracy = _first_result(summary).get("accuracy") or {}
    test = pairs.get("test") or _first_result(summary).get("pairs")
    seeds = _seed_count(summary)
    if test:
        changes, distractors = accuracy.get("change_pairs"), accuracy.get("distractor_pairs")
        check = f"The check is {_plural(seeds, 'seed')} scored on {test} test pairs"
        if changes and distractors is not None:
            check += (
                f" ({changes} changes, {distractors} distractors), so one caption moves change accuracy by "
                f"{100 / test:.1f} points and type accuracy by {100 / changes:.1f}"
            )
        parts.append(check + ":")
    if summary.get("quick"):
        parts.append(
            "this quick demo is an end-to-end check that every step runs, not a benchmark, and gaps of a few points "
            "between its models are within chance (the paired intervals below say which are not)."
        )
    elif seeds == 1:
        parts.append(
            "one seed, so the intervals below cover the sampling of the test pairs only, not the spread between "
            "training runs (<code>--seeds 3</code> or more measure both)."
        )
    else:
        parts.append("the figures are means over the seeds, ± their standard deviation.")
    return parts


def _schedule(budget: dict[str, Any], part: str) -> str:
    """``N steps, batch B, lr L`` of a training part of the demo's budget (``vqgan``, ``stage1``, ``stage2``)."""
    lr = budget.get(f"{part}_lr")
    lr_text = f"{lr:g}" if isinstance(lr, (int, float)) else "?"
    return f"{budget.get(f'{part}_steps')} steps, batch {budget.get(f'{part}_batch')}, lr {lr_text}"


def budget_rows(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """What was run, as (part, what) rows: only the parts that applied (no tokenizer steps when the embedded
    tokenizer was used, no validation schedule without validation)."""
    budget, pairs = summary.get("budget") or {}, summary.get("pairs") or {}
    rows = []
    if "scenes" in budget:
        rows.append(("benchmark", f"{budget['scenes']} synthetic scenes, {2 * budget['scenes']} pairs"))
    tokenizer = summary.get("tokenizer")
    if tokenizer == "trained":
        rows.append(("tokenizer (VQGAN)", f"trained here: {_schedule(budget, 'vqgan')}"))
    elif tokenizer:
        rows.append(("tokenizer (VQGAN)", f"{tokenizer}: shipped with the package, not trained here"))
    if "stage1_steps" in budget:
        on = f"the first {budget['stage1_pairs']}" if budget.get("stage1_pairs") else "all"
        stage1 = f"{_schedule(budget, 'stage1')}, on {on} training pairs"
        procedures = summary.get("procedures")
        if procedures:
            stage1 += f"; frames: {PROCEDURE_TEXT.get(procedures, procedures)}"
        rows.append(("stage 1 (procedure modeling)", stage1))
    if "stage2_steps" in budget:
        longer = budget["stage2_steps"] + budget.get("stage1_steps", 0)
        stage2 = f"{_schedule(budget, 'stage2')} after stage 1; {longer} steps from a random encoder (equal budgets)"
        if budget.get("stage2_encoder_lr"):
            stage2 += f", encoder lr {budget['stage2_encoder_lr']:g} after stage 1"
        rows.append(("stage 2 (captioning)", stage2))
    if budget.get("val_every"):
        kept = f"the best by {budget.get('select_metric', 'validation')} on {budget.get('val_pairs')} validation pairs"
        rows.append(("checkpoint kept", f"{kept}, checked every {budget['val_every']} steps"))
    elif "val_every" in budget:
        rows.append(("checkpoint kept", "the last step's (no validation)"))
    if "test" in pairs:
        which = " (the first of the split)" if budget.get("max_test_pairs") else ""
        rows.append(("test", f"{pairs['test']} pairs{which}"))
    if summary.get("seeds"):
        rows.append(("training seeds", ", ".join(str(seed) for seed in summary["seeds"])))
    return rows


def budget_table(summary: dict[str, Any]) -> str:
    """:func:`budget_rows` as an HTML table, or a note when ``metrics.json`` records no budget."""
    rows = budget_rows(summary)
    if not rows:
        return "<p class='note'>metrics.json records no budget.</p>"
    cells = "".join(
        f"<tr><td>{html.escape(part)}</td><td class='text'>{html.escape(what)}</td></tr>" for part, what in rows
    )
    return f"<table><tr><th>part</th><th class='text'>what was run</th></tr>{cells}</table>"


def _interval(low: float | None, high: float | None) -> str:
    return "n/a" if low is None or high is None else f"[{100 * low:+.1f}, {100 * high:+.1f}]"


def paired_table(summary: dict[str, Any]) -> str:
    """HTML table of the paired differences (``metrics.json``'s ``paired`` rows): ProCap minus each other model and
    the 2 x 2 interaction, in points, with the 95 % interval over the test pairs and, from two seeds on, the one
    over the seeds and each seed's difference."""
    rows = summary.get("paired") or []
    if not rows:
        return "<p class='note'>metrics.json holds no paired comparisons (a demo from before they were recorded).</p>"
    over_seeds = any(row.get("seed_low") is not None for row in rows)
    head = ["ProCap (k=2) minus", "figure", "ProCap %", "other %", "difference", "95 % over pairs"]
    head += ["95 % over seeds", "per seed"] if over_seeds else []
    head.append("pairs")
    lines = []
    for row in rows:
        accuracies = [row.get("model_accuracy"), row.get("baseline_accuracy")]
        cells = [html.escape(str(row["baseline"])), html.escape(str(row["figure"]))]
        cells += ["–" if value is None else f"{100 * value:.1f}" for value in accuracies]
        cells += [f"{100 * row['difference']:+.1f}", _interval(row.get("low"), row.get("high"))]
        if over_seeds:
            cells.append(_interval(row.get("seed_low"), row.get("seed_high")))
            cells.append(" ".join(f"{100 * d:+.1f}" for d in row.get("per_seed", [])))
        cells.append(str(row.get("pairs", "")))
        lines.append("<tr>" + "".join(f"<td>{cell}</td>" for cell in cells) + "</tr>")
    note = (
        "Points of accuracy (mean over seeds). 95 % intervals: over pairs, a bootstrap over the test pairs with both "
        "models scored on each resample; "
    )
    note += (
        "over seeds, Student's t on the seeds' differences. "
        if over_seeds
        else "over seeds: none, one seed leaves no spread between training runs to measure. "
    )
    note += (
        "An interval that holds 0 means this check cannot tell the two models apart on that figure. The 2x2 "
        "interaction is (ProCap - stage-1 static) - (no stage 1 - static): what the procedure queries gain with "
        "stage 1 beyond what they gain without it (the paper's claim is that it is positive)."
    )
    header = "".join(f"<th>{html.escape(title)}</th>" for title in head)
    return f"<table><tr>{header}</tr>{''.join(lines)}</table><p class='note'>{html.escape(note)}</p>"


def _counted(fraction: float | None, pairs: int | None) -> str:
    """A fraction in % with how many of how many pairs it counts, marked when the pairs are few."""
    if fraction is None or not pairs:
        return "n/a"
    text = f"{100 * fraction:.1f} ({round(fraction * pairs)}/{pairs})"
    return f"<span class='few'>{text}</span>" if pairs < FEW_PAIRS else text


def per_type_table(summary: dict[str, Any]) -> str:
    """HTML table: one row per change type, CIDEr and type accuracy (%) of every model (the first seed's), each
    accuracy with its count of right captions over its pairs."""
    results = summary["results"]
    by_type = _first_result(summary)["by_type"]
    groups = [t for t in by_type if t not in ("change", "total")] + [t for t in ("change", "total") if t in by_type]
    head = "<th>change type</th><th>pairs</th>"
    head += "".join(f"<th>CIDEr<br>{html.escape(label)}</th>" for label in results)
    head += "".join(f"<th>type acc. %<br>{html.escape(label)}</th>" for label in results)
    rows = []
    for kind in groups:
        scores = [r["by_type"].get(kind, {}) for r in results.values()]
        cider = [f"{s['CIDEr']:.1f}" if "CIDEr" in s else "n/a" for s in scores]
        type_acc = [_counted(*_type_accuracy(report, kind)) for report in results.values()]
        pairs = scores[0].get("pairs")
        shown = "" if pairs is None else (f"<span class='few'>{pairs}</span>" if pairs < FEW_PAIRS else str(pairs))
        cells = [shown, *cider, *type_acc]
        rows.append(f"<tr><td>{html.escape(kind)}</td>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    note = (
        "Test split, the first seed's run. pairs: how many test pairs each row's CIDEr comes from; type acc.: the "
        "caption names the right kind of change, as right captions / change pairs (none for distractors: their "
        f"figure is the false-positive rate above). In red: fewer than {FEW_PAIRS} pairs, where one caption moves "
        "the figure by more than 10 points."
    )
    return f"<table><tr>{head}</tr>{''.join(rows)}</table><p class='note'>{html.escape(note)}</p>"


def _type_accuracy(report: dict[str, Any], kind: str) -> tuple[float | None, int | None]:
    """(type accuracy, change pairs it counts) of one model's first seed on the pairs of ``kind``."""
    accuracy = report.get("accuracy", {})
    if kind == "change":  # every change pair: the first seed's overall figure
        seeds = report.get("seeds") or [{}]
        return seeds[0].get("accuracy", {}).get("type", accuracy.get("type")), accuracy.get("change_pairs")
    found = accuracy.get("per_type", {}).get(kind, {})
    return found.get("type"), found.get("change_pairs", found.get("pairs"))


def curves_png(folder: Path) -> bytes | None:
    """PNG of :func:`curves_figure`, None without logs."""
    figure = curves_figure(folder)
    if figure is None:
        return None
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()


def curves_figure(folder: Path) -> Any:
    """The training curves, None without logs: stage-1 loss and alignment loss (against its chance level), stage-2
    loss and validation CIDEr, against steps.

    A loss spanning a factor of :data:`LOG_SCALE_MIN_RATIO` or more is drawn on a log scale, each model with its own
    line style and markers: the four stage-2 losses differ by a few percent and, on a linear scale, lay on top of one
    another. A narrower one (a short stage 1) is drawn linear, where a log axis would show one labelled tick or none.
    """
    from matplotlib.figure import Figure  # Figure + savefig use the Agg renderer: no display, no pyplot state

    logs = {label: read_log(folder / name / "log.jsonl") for name, label, _ in RUNS}
    stage1 = {"stage 1 (ProCap)": read_log(folder / "stage1" / "log.jsonl")}
    if not any(stage1.values()) and not any(logs.values()):
        return None
    figure = Figure(figsize=(13, 7), dpi=90)
    (loss1, align), (loss2, cider) = figure.subplots(2, 2)
    _plot(loss1, stage1, "loss", "stage-1 loss (MSM, align and csy, weighted as the model config says)", "loss")
    _plot(align, stage1, "align", "stage-1 alignment loss (caption vs procedure)", "alignment loss")
    if align.lines:
        align.axhline(ALIGN_CHANCE, color="grey", linestyle=":", label=f"chance (2 ln 2 = {ALIGN_CHANCE:.3f})")
        align.legend(fontsize=8)
    _plot(loss2, logs, "loss", "stage-2 training loss", "loss")
    _plot(cider, logs, "val/CIDEr", "validation CIDEr", "CIDEr (x100)")
    for axes in (loss1, loss2):
        scale_loss_axis(axes)
    figure.tight_layout()
    return figure


# (line, marker, marker size, filled) per model: hollow markers of falling size nest where the curves coincide.
LINE_STYLES = (("-", "o", 8, False), ("--", "s", 5.5, False), ("-.", "D", 4.5, False), (":", "^", 4, True))
# A loss axis is drawn on a log scale only when its values span at least this factor: then LOG_TICK_MANTISSAS give
# it at least three labelled ticks (a short stage 1's 7.0 to 8.4 would get one, or none).
LOG_SCALE_MIN_RATIO = 4.0
# The round values a log axis is labelled with, roundest first: the first set that gives LOG_LABELS ticks is used.
LOG_TICK_MANTISSAS = ((1.0,), (1.0, 2.0, 5.0), (1.0, 2.0, 3.0, 5.0), (1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0))
LOG_LABELS = 4


def log_ticks(low: float, high: float) -> list[float]:
    """Round values between ``low`` and ``high`` (both > 0) to label a log axis with: the roundest mantissas of
    :data:`LOG_TICK_MANTISSAS` that give :data:`LOG_LABELS` of them, else the finest set's."""
    exponents = range(math.floor(math.log10(low)), math.floor(math.log10(high)) + 1)
    ticks: list[float] = []
    for mantissas in LOG_TICK_MANTISSAS:
        # float of the decimal text: 1.5e-1 exactly as written, not 1.5 * 10 ** -1
        ticks = [v for e in exponents for m in mantissas if low <= (v := float(f"{m}e{e}")) <= high]
        if len(ticks) >= LOG_LABELS:
            break
    return ticks


def scale_loss_axis(axes: Any) -> None:
    """A log scale with labelled round ticks when the drawn losses span :data:`LOG_SCALE_MIN_RATIO` or more, else
    the linear scale (its ticks are matplotlib's)."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    values = [float(v) for line in axes.lines for v in line.get_ydata()]
    if not values or min(values) <= 0 or max(values) / min(values) < LOG_SCALE_MIN_RATIO:
        return
    axes.set_yscale("log")
    axes.yaxis.set_major_locator(FixedLocator(log_ticks(min(values), max(values))))
    axes.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))  # 0.3, not 3 x 10^-1
    axes.yaxis.set_minor_formatter(NullFormatter())
    axes.set_ylabel(f"{axes.get_ylabel()} (log scale)")


def _plot(axes: Any, logs: dict[str, list[dict]], key: str, title: str, ylabel: str) -> None:
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
    axes.set_ylabel(ylabel)
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


@dataclass(frozen=True)
class Stage1Outcome:
    """What stage 1 did before the ProCap run the examples are drawn with, read from its run folders.

    Attributes:
        ran: whether the ProCap run started from stage 1 (None: the folder does not say).
        steps: the last step stage 1 logged.
        align: mean alignment loss over the last quarter of stage 1's logged steps (chance: :data:`ALIGN_CHANCE`).
        align_accuracy, msm_accuracy: the alignment and masked-token accuracies over the same steps.
    """

    ran: bool | None
    steps: int | None = None
    align: float | None = None
    align_accuracy: float | None = None
    msm_accuracy: float | None = None

    @property
    def align_left_chance(self) -> bool | None:
        """Whether the alignment loss ended clearly below chance (None without a logged alignment loss)."""
        return None if self.align is None else self.align < ALIGN_CHANCE - ALIGN_MARGIN


def _mean_of(records: list[dict[str, Any]], key: str) -> float | None:
    values = [float(r[key]) for r in records if isinstance(r.get(key), (int, float))]
    return statistics.fmean(values) if values else None


def stage1_outcome(folder: Path) -> Stage1Outcome:
    """:class:`Stage1Outcome` of the demo folder's first seed: whether its ProCap run started from a stage-1
    checkpoint (``procap/stage2_config.json``'s ``init``, else whether ``stage1/log.jsonl`` holds records) and how
    far stage 1's alignment loss got."""
    config_file = folder / "procap" / "stage2_config.json"
    config = read_json_file(config_file, "run configuration") if config_file.is_file() else None
    records = [r for r in read_log(folder / "stage1" / "log.jsonl") if "step" in r]
    if isinstance(config, dict):
        ran: bool | None = bool(config.get("init"))
    else:
        ran = True if records else None
    if not ran or not records:
        return Stage1Outcome(ran)
    last = [r for r in records if "align" in r]
    last = last[-max(1, len(last) // 4) :]
    return Stage1Outcome(
        ran,
        steps=int(records[-1]["step"]),
        align=_mean_of(last, "align"),
        align_accuracy=_mean_of(last, "align_acc"),
        msm_accuracy=_mean_of(last, "msm_acc"),
    )


def imagined_note(stage: str | None, stage1: Stage1Outcome) -> str:
    """What the imagined frames of a ProCap checkpoint of ``stage`` show, given what its stage 1 did."""
    if stage != "stage2" or stage1.ran is None:
        return head_note(stage)
    if not stage1.ran:
        return (
            "the ProCap run started from a random encoder (no stage 1), so its MSM head was never trained: the frames "
            "are noise."
        )
    head = (
        "The frames are what stage 1's MSM head (stage 2 does not train it) reads from the encoder after stage 2 "
        "fine-tuned it for captioning"
    )
    if stage1.align is None:
        return f"Stage 1 ran before captioning (its log in this folder records no alignment loss). {head}."
    figures = f"mean alignment loss {stage1.align:.3f} over its last logged steps, chance 2 ln 2 = {ALIGN_CHANCE:.3f}"
    if stage1.align_accuracy is not None:
        figures += f"; alignment accuracy {100 * stage1.align_accuracy:.0f} %"
    if stage1.align_left_chance:
        text = f"Stage 1 ran ({stage1.steps} steps) and its alignment loss left chance ({figures})."
    else:
        text = (
            f"Stage 1 ran ({stage1.steps} steps) but its alignment loss stayed at chance ({figures}): it did not "
            "learn to tell a pair's caption from another's."
        )
    if stage1.msm_accuracy is not None:
        text += f" Its masked-token accuracy ended at {100 * stage1.msm_accuracy:.1f} %."
    text += f" {head}"
    if stage1.msm_accuracy is not None and stage1.msm_accuracy < 0.5:
        text += (
            ", and that head got most masked tokens wrong in training (fully masked frames, as here, are harder "
            "still): read the frames as a diagnostic of the head, not as a picture of the change"
        )
    return text + "."


class Imaginer:
    """Loads the ProCap checkpoint once and imagines the procedure of a before/after pair (None if it cannot).

    ``note`` says what the frames show; ``stage1`` (what the run's stage 1 did) makes it specific to the demo.
    """

    def __init__(self, checkpoint: Path | None, stage1: Stage1Outcome | None = None) -> None:
        self.model = self.vocab = self.stage = None
        self.note = (
            "not drawn (imagine_procedures=False)" if checkpoint is None else f"no ProCap checkpoint at {checkpoint}"
        )
        if checkpoint is not None and checkpoint.is_file():
            self.model, self.vocab, meta = load_checkpoint(checkpoint, map_location="cpu")
            self.stage = meta.get("extra", {}).get("stage")
            try:
                check_imaginable(self.model)
                self.note = imagined_note(self.stage, stage1 or Stage1Outcome(None))
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
        image = image.resize((size, size), Image.Resampling.BICUBIC)
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
    """One line on how the run went: quick or full, device and total time."""
    kind = "quick" if summary.get("quick") else "full"
    total = summary.get("total_s")
    took = f", {total / 60:.0f} min in total" if isinstance(total, (int, float)) else ""
    return f"{kind} demo on {summary.get('device', '?')}{took}"


def sample_image_size(folder: Path, samples: list[dict[str, Any]]) -> int | None:
    """The side of the benchmark's images in pixels: half the width of the first sample (before | after)."""
    for row in samples:
        path = folder / str(row.get("image", ""))
        if path.is_file():
            with open_image(path) as image:
                return image.width // 2
    return None


def report_html(folder: Path, imagine_procedures: bool = True) -> str:
    """The page for the demo output ``folder`` (see the module docstring)."""
    summary = read_json(folder / "metrics.json", "demo metrics")
    if not isinstance(summary, dict) or not isinstance(summary.get("results"), dict) or not summary["results"]:
        raise ProCapError(f"demo metrics {folder / 'metrics.json'} holds no results.")
    samples = read_json(folder / "samples.json", "demo samples")
    labels = list(summary["results"])
    stage1 = stage1_outcome(folder)
    imaginer = Imaginer(folder / "procap" / "best.safetensors" if imagine_procedures else None, stage1)
    curves = curves_png(folder)
    body = [
        "<h1>ProCap demo report</h1>",
        about_html(summary, sample_image_size(folder, samples)),
        f"<p class='note'>{html.escape(run_line(summary))}</p>",
        "<h2 id='budget'>What was run</h2>",
        budget_table(summary),
        "<h2 id='metrics'>Metrics</h2>",
        metrics_table(summary),
        "<h2 id='paired'>Paired differences</h2>",
        paired_table(summary),
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
