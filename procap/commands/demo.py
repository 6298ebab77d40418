"""`procap demo`: synthetic benchmark -> VQGAN -> stage 1 -> stage 2; the four cells of the paper's 2 x 2 ablation
(stage 1 or not, procedure queries or not: ProCap, ProCap without stage 1, the stage-1 static pair and the static
pair) compared on caption metrics and correctness (the pipeline: procap/experiments/demo.py)."""

from __future__ import annotations

import argparse
import os

from procap.core.config import DEMO_MAX_SEEDS, DEMO_MODELS, DEMO_PROCEDURES, VIEWPOINTS

HELP = "Run the whole pipeline on the embedded synthetic benchmark: ProCap and its 2 x 2 ablation compared."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _add_output_arguments(parser)
    _add_budget_arguments(parser)
    _add_pipeline_arguments(parser)


def _add_output_arguments(parser: argparse.ArgumentParser) -> None:
    """The "output" group: where the demo writes, going on from an earlier one, what it shows as it runs."""
    group = parser.add_argument_group("output")
    group.add_argument("--out", default="runs/demo", help="output folder (default runs/demo)")
    group.add_argument(
        "--resume",
        action="store_true",
        help="read back the seeds of --out whose four models were evaluated (same settings) and train only the "
        "others: an interrupted demo goes on from its last finished seed",
    )
    group.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="progress bars, and one status line of the runs training side by side (default on; --no-progress: "
        "neither, only the timestamped lines)",
    )


def _add_budget_arguments(parser: argparse.ArgumentParser) -> None:
    """The "budget and machine" group: how much is trained, with which seeds, on what."""
    group = parser.add_argument_group("budget and machine")
    group.add_argument(
        "--quick",
        action="store_true",
        help="tiny budget: an end-to-end check (about 10 min for the four models on a 2-core machine; "
        "longer beside other work)",
    )
    group.add_argument("--seed", type=int, default=0, help="random seed of the benchmark and first run (default 0)")
    group.add_argument(
        "--seeds",
        type=int,
        default=1,
        help="training seeds per model, 1 to 64; reports mean and std over them (default 1)",
    )
    group.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    group.add_argument("--workers", type=int, default=0, help="DataLoader workers (default 0)")
    group.add_argument(
        "--jobs",
        type=int,
        default=None,
        help="stage-2 runs of a seed side by side, one process each (1-4; default: one per thread on a CPU with 2+ "
        "threads, at most 4, else 1)",
    )


def _add_pipeline_arguments(parser: argparse.ArgumentParser) -> None:
    """The "benchmark and pipeline" group: the scenes, stage 1's frames and the tokenizer."""
    group = parser.add_argument_group("benchmark and pipeline")
    group.add_argument(
        "--procedures",
        choices=DEMO_PROCEDURES,
        default="interpolated",
        help="stage-1 frames: the optical-flow procedure pipeline (interpolated, the default), the cross-fade "
        "stand-in, or the benchmark's exact intermediate frames (truth: an upper bound for stage 1)",
    )
    group.add_argument(
        "--viewpoint",
        choices=VIEWPOINTS,
        default=None,
        help="the benchmark's camera and light change within a pair (procap synth --viewpoint; default distractor, "
        "as in CLEVR-Change, whose change pairs are jittered too; with --quick none, as its budget learns nothing "
        "under viewpoint change)",
    )
    group.add_argument(
        "--train-tokenizer",
        action="store_true",
        help="fit a new VQGAN tokenizer (the budget's steps) instead of using the one shipped in the package",
    )


def demo_packages(procedures: str) -> dict[str, str]:
    """The optional packages the demo imports on its way, each with what needs it: checked before it starts (a
    missing metric package stopped it after 38 s of work)."""
    needs = {"pycocoevalcap": "the caption metrics", "matplotlib": "the report's training curves"}
    if procedures == "interpolated":
        needs |= {"cv2": "the optical-flow procedures", "h5py": "the procedure cache"}
    return needs


def run(args: argparse.Namespace) -> int:
    from procap.core.extras import require_all

    require_all(demo_packages(args.procedures), "procap demo")  # before the pipeline's imports: the first second
    from procap.core import validate

    validate.number(args.seeds, "--seeds", minimum=1, maximum=DEMO_MAX_SEEDS)
    # the runs use seeds seed .. seed + seeds - 1
    validate.seed(args.seed, "--seed", count=args.seeds)
    validate.number(args.workers, "--workers", minimum=0, maximum=validate.MAX_WORKERS)
    validate.number(args.jobs, "--jobs", minimum=1, maximum=len(DEMO_MODELS))
    validate.output_dir(args.out, "--out")
    validate.device(args.device)  # the one check that imports torch comes last
    from procap.experiments.demo import run_demo
    from procap.experiments.report import REPORT_NAME

    run_demo(
        args.out,
        quick=args.quick,
        seed=args.seed,
        device=args.device,
        workers=args.workers,
        progress=args.progress,
        procedures=args.procedures,
        viewpoint=args.viewpoint,
        seeds=args.seeds,
        train_tokenizer=args.train_tokenizer,
        jobs=args.jobs,
        resume=args.resume,
    )
    print(f"\nwrote checkpoints, metrics.json and samples under {args.out}")
    print(f"report: {os.path.join(args.out, REPORT_NAME)}")
    return 0
