"""`procap vqgan`, `procap pretrain` and `procap train`: the three training stages, one command each, built here.

The stages differ in what they train (:data:`STAGES`: the help line, the training function, what its file is called)
and not in how they run: flags from :mod:`procap.commands.cli_args`, every check before the training code is
imported, the data read before the notes are printed (bad data is then the one line), one result line under torchrun.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Stage:
    """What sets a training command apart: its help line, where its training function lives, what it returns, and
    whether it validates (reads the ``val`` split too)."""

    help: str
    module: str
    function: str
    result: str
    validates: bool = False


STAGES: dict[str, Stage] = {
    "vqgan": Stage(
        help="Train the VQGAN tokenizer on a dataset's training images (reconstruction loss).",
        module="procap.train.vqgan_train",
        function="train_vqgan",
        result="VQGAN weights",
    ),
    "pretrain": Stage(
        help="Stage 1: pre-train the procedure encoder on explicit procedures (L_PRO).",
        module="procap.train.stage1",
        function="pretrain",
        result="stage-1 checkpoint",
    ),
    "train": Stage(
        help="Stage 2: train the captioner (procedure queries + decoder); keeps the best checkpoint by validation "
        "CIDEr (or --select).",
        module="procap.train.stage2",
        function="train",
        result="best checkpoint",
        validates=True,
    ),
}


@dataclass(frozen=True)
class TrainingCommand:
    """One stage as :mod:`procap.commands.cli` takes a command: ``HELP``, ``add_arguments(parser)``, ``run(args)``."""

    stage: str

    @property
    def HELP(self) -> str:
        return STAGES[self.stage].help

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        from procap.commands.cli_args import add_common_arguments

        add_common_arguments(parser, self.stage)

    def run(self, args: argparse.Namespace) -> int:
        return run_stage(self.stage, args)


def subcommand(name: str) -> TrainingCommand:
    """The command ``procap <name>`` for a stage of :data:`STAGES` (how :mod:`procap.commands.cli` asks for it)."""
    return TrainingCommand(name)


def run_stage(stage: str, args: argparse.Namespace) -> int:
    """Check everything, read the data, train, and print where the result is (once under torchrun)."""
    import importlib

    from procap.commands.cli_args import config_from_args, print_notes

    notes: list[str] = []
    config = config_from_args(stage, args, notes)  # every check, before the training code is imported
    from procap.train.common import load_pairs
    from procap.train.distributed import env_context, teardown

    spec = STAGES[stage]
    train: Callable[..., Any] = getattr(importlib.import_module(spec.module), spec.function)
    is_main = env_context().is_main  # a bad torchrun environment is refused here, before the notes
    splits = ("train", "val") if spec.validates else ("train",)
    # bad data is refused before the notes are printed: its error is then the one line
    pairs = [load_pairs(config, split) for split in splits]
    print_notes(notes)
    path = train(config, *pairs)
    # Every rank leaves the process group before it exits: left to interpreter shutdown, gloo's teardown races
    # with the peer's, and one node's launcher may then wait for the other until its exit timeout.
    teardown()
    if is_main:  # under torchrun: one line, not one per process
        print(f"{spec.result}: {path}")
    return 0
