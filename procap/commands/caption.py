"""`procap caption --ckpt C BEFORE AFTER [...]` (or `--pairs LIST`, or `--before-dir A --after-dir B`): caption
image pairs with procap.fast.Captioner, printed or streamed to `--out FILE.jsonl|.csv` (resumable)."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from procap.commands.hub_args import CHECKPOINT_HELP, add_hub_arguments, checkpoint_file, local_checkpoint
from procap.core import validate
from procap.core.config import COMPUTE_DTYPES
from procap.core.errors import ProCapError
from procap.model.decoding import SHORT_FORM, STRATEGIES, option_fields, resolve_strategy  # torch-free

if TYPE_CHECKING:
    from procap.fast.caption_file import CaptionFile
    from procap.model.decoding import DecodingStrategy

logger = logging.getLogger(__name__)

HELP = "Caption (before, after) image pairs with a trained checkpoint (fast path: bf16 + CUDA graphs on GPU)."
# Without --out the captions are printed: a reader that closes stdout loses them, which is an error (procap.commands.cli).
RESULTS_ON_STDOUT = "the captions"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _add_pair_arguments(parser)
    _add_output_arguments(parser)
    _add_model_arguments(parser)
    add_decoding_arguments(parser)
    add_hub_arguments(parser)


def _add_pair_arguments(parser: argparse.ArgumentParser) -> None:
    """The pairs to caption: image arguments, or the "many pairs" group."""
    parser.add_argument("images", nargs="*", metavar="IMAGE", help="BEFORE AFTER [BEFORE AFTER ...] image files")
    source = parser.add_argument_group("many pairs (instead of IMAGE arguments)")
    source.add_argument(
        "--pairs",
        metavar="LIST",
        help="a .csv file with before and after columns or a .jsonl file of {before, after} objects; relative "
        "paths are read against the list's folder",
    )
    source.add_argument("--before-dir", metavar="DIR", help="before images, paired by file name with --after-dir")
    source.add_argument("--after-dir", metavar="DIR", help="after images, paired by file name with --before-dir")


def _add_output_arguments(parser: argparse.ArgumentParser) -> None:
    """The "output" group: printed or written, resumed or replaced, with or without a progress bar."""
    output = parser.add_argument_group("output")
    output.add_argument(
        "--out",
        metavar="FILE",
        help="write before, after, caption rows to a .jsonl or .csv file, each batch as it is captioned",
    )
    output.add_argument(
        "--resume", action="store_true", help="with an existing --out, caption only the pairs it does not hold"
    )
    output.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    output.add_argument("--json", action="store_true", help="print a JSON list of {before, after, caption}")
    output.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="show a progress bar on stderr when there is more than one batch (default on)",
    )


def _add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """The "checkpoint and compute" group: the model, where and in what precision it runs, batch and length."""
    group = parser.add_argument_group("checkpoint and compute")
    group.add_argument(
        "--ckpt",
        required=True,
        help=CHECKPOINT_HELP,
    )
    group.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda when available)")
    group.add_argument(
        "--dtype",
        default=None,
        choices=COMPUTE_DTYPES,
        help="compute dtype (default: bf16 on CUDA, fp32 on CPU)",
    )
    group.add_argument(
        "--max-len",
        type=int,
        default=None,
        help="caption length including BOS (default: the checkpoint's max_caption_len)",
    )
    group.add_argument("--batch-size", type=int, default=32, help="pairs per batch (default 32)")


def decoding_flags() -> dict[str, str]:
    """Every registered strategy's options by name, each to its flag (``{"num_beams": "--beams", ...}``)."""
    flags = {"strategy": "--strategy"}
    for strategy in STRATEGIES.values():
        flags |= {name: field.metadata["flag"] for name, field in option_fields(strategy).items()}
    return flags


def add_decoding_arguments(parser: argparse.ArgumentParser) -> None:
    """``--strategy`` and the options of every strategy of :data:`procap.model.decoding.STRATEGIES`, each from its
    declaration there (shared with ``procap evaluate``); none has a default here, so that what was given is known."""
    group = parser.add_argument_group("decoding")
    group.add_argument(
        "--strategy",
        choices=list(STRATEGIES),
        help="how each token is chosen: greedy (the default), beam (beam search) or sample (sampling, reproducible "
        "by --seed); --beams N alone is beam search",
    )
    added = set()
    for strategy in STRATEGIES.values():
        for field in option_fields(strategy).values():
            flag = field.metadata["flag"]
            if flag not in added:
                added.add(flag)
                group.add_argument(flag, type=field.metadata["kind"], help=field.metadata["help"])


def strategy_from_args(args: argparse.Namespace) -> DecodingStrategy:
    """The strategy ``--strategy`` and its options ask for (``--beams N`` alone: beam search), checked once.

    Raises:
        ProCapError: an option of another strategy, or a value out of range, naming its flag.
    """
    flags = decoding_flags()
    given = {name: getattr(args, flag[2:].replace("-", "_")) for name, flag in flags.items() if name != "strategy"}
    given = {name: value for name, value in given.items() if value is not None}
    short = {name: given.pop(name) for name in list(given) if name in option_fields(SHORT_FORM)}
    return resolve_strategy(args.strategy, given, **short, spelled=flags)


def pairs_from_paths(paths: list[str]) -> list[tuple[Path, Path]]:
    """Group BEFORE AFTER paths into pairs, checking that every one is an existing file."""
    if len(paths) % 2:
        raise ProCapError(f"caption needs BEFORE AFTER pairs of images, got an odd number of paths ({len(paths)})")
    files = [validate.input_file(path, "image file") for path in paths]
    return list(zip(files[0::2], files[1::2]))


def pairs_from_args(args: argparse.Namespace) -> list[tuple[Path, Path]]:
    """The pairs of exactly one source: IMAGE arguments, ``--pairs`` or ``--before-dir`` with ``--after-dir``."""
    from procap.data.pair_lists import match_folders, read_pair_list

    folders = args.before_dir is not None or args.after_dir is not None
    given = [
        name for name, used in (("IMAGE arguments", args.images), ("--pairs", args.pairs), ("folders", folders)) if used
    ]
    if len(given) != 1:
        both = ", not from " + " and ".join(given) if given else ""
        raise ProCapError(
            "caption takes its pairs from one of BEFORE AFTER image arguments, --pairs LIST or "
            f"--before-dir with --after-dir{both}."
        )
    if args.pairs is not None:
        return read_pair_list(args.pairs)
    if folders:
        if args.before_dir is None or args.after_dir is None:
            raise ProCapError("--before-dir and --after-dir go together: give both folders.")
        return match_folders(args.before_dir, args.after_dir)
    return pairs_from_paths(args.images)


def run(args: argparse.Namespace) -> int:
    # The checks that need no torch (pairs, numbers, flags, a local --ckpt, --out) come before the device's
    # (_caption's first line), which imports it: a wrong argument is one sentence in the first second (docs/errors.md).
    pairs = pairs_from_args(args)
    validate.number(args.batch_size, "--batch-size", minimum=1)
    validate.caption_length(args.max_len, "--max-len")  # its ceiling is the model's, checked once loaded
    strategy = strategy_from_args(args)
    if (args.resume or args.overwrite) and args.out is None:
        raise ProCapError(f"{'--resume' if args.resume else '--overwrite'} applies to an --out file; give one.")
    if args.out is not None and args.json:
        raise ProCapError("--json prints the captions; with --out they go to the file (.jsonl for JSON).")
    local_checkpoint(args)
    output = None
    if args.out is not None:
        from procap.fast.caption_file import CaptionFile

        output = CaptionFile(args.out, resume=args.resume, overwrite=args.overwrite)
    with output or contextlib.nullcontext():
        return _caption(args, pairs, output, strategy)


def decoding_settings(args: argparse.Namespace, checkpoint: Path, strategy: DecodingStrategy) -> dict[str, Any]:
    """The options that change a caption, keyed by flag, as ``--out``'s settings record them: ``--max-len`` as the
    captioner will use it (the checkpoint's own when not given), ``--strategy`` and every option of that strategy
    (the defaults of those not given; ``--beams 1`` is greedy, which has none)."""
    from procap.train.batch_memory import checkpoint_config

    max_len = args.max_len
    if max_len is None:
        config = checkpoint_config(checkpoint)
        max_len = config.max_caption_len if config is not None else None
    flags = decoding_flags()
    options = {flags[name]: value for name, value in strategy.options().items()}
    return {"--max-len": max_len, "--strategy": strategy.name, **options}


def checkpoint_identity(checkpoint: Path) -> dict[str, Any]:
    """``{"file", "bytes", "sha256"}`` of the weights: a hash, so that retrained weights under the same name are
    told apart and the same weights moved elsewhere are not (about a second per GB, once per run)."""
    from procap.core.files import sha256_of

    return {"file": str(checkpoint.resolve()), "bytes": checkpoint.stat().st_size, "sha256": sha256_of(checkpoint)}


def _caption(
    args: argparse.Namespace, pairs: list[tuple[Path, Path]], output: CaptionFile | None, strategy: DecodingStrategy
) -> int:
    from procap.data.pair_lists import pair_key

    device = validate.device(args.device)  # the first check that imports torch, before a download or the model
    done = [pair for pair in pairs if output is not None and pair_key(*pair) in output.done]
    todo = [pair for pair in pairs if output is None or pair_key(*pair) not in output.done]
    checkpoint = checkpoint_file(args)
    if output is not None:
        output.check_settings(checkpoint_identity(checkpoint), decoding_settings(args, checkpoint, strategy))
        if output.note:
            logger.info("procap: note: %s.", output.note)
    if not todo:
        logger.info("%s already holds the captions of all %d pairs.", args.out, len(pairs))
        return 0
    from procap.train.batch_memory import check_checkpoint_batch

    # a batch is never larger than the pairs given (a CUDA bucket of --batch-size rows would be allocated whole)
    batch_size = check_checkpoint_batch(checkpoint, args.batch_size, len(todo), device, "pairs given", "caption")
    from procap.fast import Captioner
    from procap.fast.caption_file import caption_batches

    captioner = Captioner.from_checkpoint(
        checkpoint,
        device=args.device,
        dtype=args.dtype,
        max_len=args.max_len,
        batch_sizes=sorted({1, 8, min(32, batch_size), batch_size}),
        strategy=strategy,
    )
    # all the pairs at once, so that the warning names and counts the far ones among them all, not one batch's; the
    # batches then need no check of their own (``domain = None`` is the Captioner's documented switch)
    captioner.check_domain([before for before, _ in todo], [after for _, after in todo])
    captioner.domain = None
    # one batch needs no bar; the bar counts the pairs a resumed file already holds
    progress = args.progress and len(todo) > batch_size
    rows: list[tuple[Path, Path, str]] = []
    for batch in caption_batches(captioner, todo, batch_size, progress=progress, done=len(done)):
        if output is not None:
            output.append(batch)
        elif args.json:
            rows += batch
        else:
            print("\n".join(caption for _, _, caption in batch), flush=True)
    if output is not None:
        output.finish()
        logger.info("%d captions written to %s (%d were there already).", len(todo), args.out, len(done))
    elif args.json:
        print(json.dumps([{"before": str(b), "after": str(a), "caption": c} for b, a, c in rows], indent=2))
    return 0
