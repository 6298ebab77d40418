"""`procap vqgan`: fit the VQGAN tokenizer to a dataset by reconstruction (L1 + codebook + commitment)."""

from __future__ import annotations

import argparse

HELP = "Train the VQGAN tokenizer on a dataset's training images (reconstruction loss)."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from procap.commands.cli_args import add_common_arguments

    add_common_arguments(parser, "vqgan")


def run(args: argparse.Namespace) -> int:
    from procap.commands.cli_args import config_from_args, print_notes

    notes: list[str] = []
    config = config_from_args("vqgan", args, notes)  # every check, before the training code is imported
    from procap.train.common import load_pairs
    from procap.train.distributed import env_context
    from procap.train.vqgan_train import train_vqgan

    is_main = env_context().is_main  # a bad torchrun environment is refused here, before the notes
    pairs = load_pairs(config, "train")  # bad data is refused before the notes: its error is the one line
    print_notes(notes)
    path = train_vqgan(config, pairs)
    if is_main:  # under torchrun: one line, not one per process
        print(f"VQGAN weights: {path}")
    return 0
