"""`procap train`: stage 2, implicit procedure captioning, initialised from a stage-1 checkpoint."""

from __future__ import annotations

import argparse

HELP = "Stage 2: train the captioner (procedure queries + decoder); keeps the best checkpoint by val CIDEr."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from procap.commands.cli_args import add_common_arguments

    add_common_arguments(parser, "train")


def run(args: argparse.Namespace) -> int:
    from procap.commands.cli_args import config_from_args, print_notes

    notes: list[str] = []
    config = config_from_args("train", args, notes)  # every check, before the training code is imported
    from procap.train.common import load_pairs
    from procap.train.distributed import env_context
    from procap.train.stage2 import train

    # bad data is refused before the notes are printed: its error is then the one line
    is_main = env_context().is_main  # a bad torchrun environment is refused here, before the notes
    pairs, val_pairs = load_pairs(config, "train"), load_pairs(config, "val")
    print_notes(notes)
    path = train(config, pairs, val_pairs)
    if is_main:  # under torchrun: one line, not one per process
        print(f"best checkpoint: {path}")
    return 0
