"""`procap train`: stage 2, implicit procedure captioning, initialised from a stage-1 checkpoint."""

from __future__ import annotations

import argparse

HELP = "Stage 2: train the captioner (procedure queries + decoder); keeps the best checkpoint by val CIDEr."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from procap.commands.cli_args import add_common_arguments

    add_common_arguments(parser, "train")


def run(args: argparse.Namespace) -> int:
    from procap.commands.cli_args import config_from_args

    config = config_from_args("train", args)  # every check, before the training code is imported
    from procap.train.distributed import env_context
    from procap.train.stage2 import train

    path = train(config)
    if env_context().is_main:  # under torchrun: one line, not one per process
        print(f"best checkpoint: {path}")
    return 0
