"""`procap pretrain`: stage 1, explicit procedure modeling (MSM + align + consistency)."""

from __future__ import annotations

import argparse

HELP = "Stage 1: pre-train the procedure encoder on explicit procedures (L_PRO)."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from procap.commands.cli_args import add_common_arguments

    add_common_arguments(parser, "pretrain")


def run(args: argparse.Namespace) -> int:
    from procap.commands.cli_args import config_from_args, print_notes

    notes: list[str] = []
    config = config_from_args("pretrain", args, notes)  # every check, before the training code is imported
    from procap.train.common import load_pairs
    from procap.train.distributed import env_context
    from procap.train.stage1 import pretrain

    is_main = env_context().is_main  # a bad torchrun environment is refused here, before the notes
    pairs = load_pairs(config, "train")  # bad data is refused before the notes: its error is the one line
    print_notes(notes)
    path = pretrain(config, pairs)
    if is_main:  # under torchrun: one line, not one per process
        print(f"stage-1 checkpoint: {path}")
    return 0
