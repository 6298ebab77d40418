"""One training run for the data-parallel tests, launched by ``torchrun`` (or plain ``python`` for one process).

Usage: ``python -m torch.distributed.run --standalone --nproc-per-node 2 tests/train/ddp_worker.py '<json>'``.
The JSON names the stage (``pretrain`` / ``train``), the synthetic dataset root, the run folder and TrainConfig
fields; ``model`` holds overrides of the 16 px test model; ``die_at`` makes rank 1 exit hard at that loss call
(a crashed rank) on the first attempt (not after a ``torchrun --max-restarts`` restart); ``kill_save``
(``{"step": N, "point": P}``) exits hard inside the save of step N at point P (:func:`_kill_in_save`). The model is
``tests.support.small_training_config``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from procap.data import load_split
from procap.model.procap import ProCap
from procap.train import stage1
from procap.train.config import TrainConfig
from tests.support import small_training_config


def small_model_builder(overrides: dict):
    """A stand-in for ``stage1.new_model`` building the 16 px test model with ``overrides``."""

    def build(preset, vocab, vqgan_path, **extra):
        return ProCap(small_training_config(len(vocab), **{**overrides, **extra}))

    return build


def _use_small_model(overrides: dict) -> None:
    stage1.new_model = small_model_builder(overrides)


def _die_on_rank1_at(call: int, method: str) -> None:
    original = getattr(ProCap, method)
    calls = {"n": 0}

    def dying(self, *args, **kwargs):
        calls["n"] += 1
        first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
        if calls["n"] == call and os.environ.get("RANK") == "1" and first_attempt:
            os._exit(3)  # a crashed process: no cleanup, no message to the others
        return original(self, *args, **kwargs)

    setattr(ProCap, method, dying)


KILLED = 86  # the exit status of a process stopped by kill_save


def _kill_in_save(step: int, point: str) -> None:
    """Stop the process outright (``os._exit``: no cleanup runs, as under ``kill -9``) inside the save of ``step``.

    ``point`` ``"weights"``: the weights are written, the training state is not; ``"moving"``: the save is complete
    and committed, and its first file has been moved into place.
    """
    from procap.train import loop

    if point == "weights":
        write_state = loop.save_training_state

        def stopping(checkpoint, optimizer, scalars, **kwargs):
            if scalars["step"] == step:
                os._exit(KILLED)
            return write_state(checkpoint, optimizer, scalars, **kwargs)

        loop.save_training_state = stopping
        return
    replace = os.replace

    def stopping_move(source, target, **kwargs):
        replace(source, target, **kwargs)
        moved = Path(source)
        first_of_a_commit = moved.parent.name.endswith(".saved") and moved.name == "last.safetensors"
        if first_of_a_commit and json.loads((moved.parent / "last.state.json").read_text())["step"] == step:
            os._exit(KILLED)

    os.replace = stopping_move


def main(spec: dict) -> None:
    _use_small_model(spec.get("model", {}))
    if spec.get("die_at"):
        _die_on_rank1_at(spec["die_at"], "stage1_loss" if spec["stage"] == "pretrain" else "stage2_loss")
    if spec.get("kill_save"):
        _kill_in_save(spec["kill_save"]["step"], spec["kill_save"]["point"])
    pairs = load_split("clevr-change", spec["data"], "train")
    vocab = stage1.build_vocab(pairs, "clevr-change")
    cfg = TrainConfig(stage=spec["stage"], progress=False, log_every=1, device="cpu", **spec["config"])
    if spec["stage"] == "pretrain":
        stage1.pretrain(cfg, pairs=pairs, vocab=vocab)
    else:
        from procap.train.stage2 import train

        val = load_split("clevr-change", spec["data"], "val")
        train(cfg, pairs=pairs, val_pairs=val, vocab=vocab, truths={})


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
