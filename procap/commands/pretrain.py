"""`procap pretrain`: stage 1, explicit procedure modeling (MSM + align + consistency)."""

from __future__ import annotations

import argparse

HELP = "Stage 1: pre-train the procedure encoder on explicit procedures (L_PRO)."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from procap.commands.cli_args import add_common_arguments

    add_common_arguments(parser, "pretrain")


def run(args: argparse.Namespace) -> int:
    from procap.commands.cli_args import config_from_args

    config = config_from_args("pretrain", args)  # every check, before the training code is imported
    from procap.train.distributed import env_context
    from procap.train.stage1 import pretrain

    path = pretrain(config)
    if env_context().is_main:  # under torchrun: one line, not one per process
        print(f"stage-1 checkpoint: {path}")
    return 0
