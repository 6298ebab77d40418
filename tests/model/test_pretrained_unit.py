"""A pretrained folder's four files are one unit (issue 48, class A): ``save_pretrained`` killed between two of its
writes left the new weights under the old model card. The kill is ``os._exit`` in a child process right after the
weights are written (as ``kill -9``: no cleanup runs)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from procap.core.errors import ProCapError
from procap.core.files import UNIT_COMMITTED, beside
from procap.data import Vocabulary
from procap.model.procap import ProCap
from tests.support import small_config, subprocess_env

ROOT = Path(__file__).resolve().parents[2]
KILLED = 86

# the child: save_pretrained(FOLDER) of a seed-2 model, stopped outright once the weights are written
_KILLED_AFTER_THE_WEIGHTS = """
import os, sys
from procap.model import pretrained
from tests.model.test_pretrained_unit import small_model

save_checkpoint = pretrained.save_checkpoint

def save_then_die(*args, **kwargs):
    save_checkpoint(*args, **kwargs)
    os._exit(KILLED)

pretrained.save_checkpoint = save_then_die
model, vocab = small_model(2)
model.save_pretrained(sys.argv[1], vocab, metrics={"CIDEr": 2.0})
""".replace("KILLED", str(KILLED))


def small_model(seed: int) -> tuple[ProCap, Vocabulary]:
    torch.manual_seed(seed)
    vocab = Vocabulary.build([f"w{i}" for i in range(12)], min_count=1)
    return ProCap(small_config(vocab_size=len(vocab))).eval(), vocab


def _files(folder: Path) -> dict[str, bytes]:
    """The folder's files a user sees (a save's staging folders are hidden)."""
    return {path.name: path.read_bytes() for path in sorted(folder.iterdir()) if not path.name.startswith(".")}


def _hidden(folder: Path) -> list[str]:
    return sorted(path.name for path in folder.iterdir() if path.name.startswith("."))


def test_a_save_killed_after_the_weights_leaves_the_previous_folder_whole(tmp_path):
    folder = tmp_path / "tiny"
    model, vocab = small_model(1)
    model.save_pretrained(folder, vocab, metrics={"CIDEr": 1.0})
    (folder / "notes.txt").write_text("the user's own file")
    previous = _files(folder)
    killed = subprocess.run(
        [sys.executable, "-c", _KILLED_AFTER_THE_WEIGHTS, str(folder)],
        cwd=ROOT,
        env=subprocess_env(OMP_NUM_THREADS="1"),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert killed.returncode == KILLED, killed.stderr[-3000:]
    assert _files(folder) == previous  # the old weights with the old card, not the new weights under it
    assert _hidden(folder) == [".model.safetensors.saving"]
    assert ProCap.from_pretrained(folder).pretrained_info["metrics"] == {"CIDEr": 1.0}

    again, vocab = small_model(3)
    again.save_pretrained(folder, vocab, metrics={"CIDEr": 3.0})
    assert sorted(_files(folder)) == sorted(previous) and _hidden(folder) == []  # notes.txt stays
    assert ProCap.from_pretrained(folder).pretrained_info["metrics"] == {"CIDEr": 3.0}


def test_a_folder_whose_save_stopped_while_moving_is_refused(tmp_path):
    folder = tmp_path / "tiny"
    model, vocab = small_model(1)
    model.save_pretrained(folder, vocab)
    beside(folder / "model.safetensors", UNIT_COMMITTED).mkdir()  # what a kill between two moves leaves
    with pytest.raises(ProCapError, match=f"{folder} holds a save_pretrained that was stopped while its files"):
        ProCap.from_pretrained(folder)
    model.save_pretrained(folder, vocab)  # the next save finishes it
    ProCap.from_pretrained(folder)
