"""A checkpoint's weights and training state are one unit (issue 48, class A): a process killed outright at any
point of a save leaves a run that resumes as the uninterrupted run trains, never step-N weights beside
step-(N-1) optimizer and RNG state; a pair that does not belong together is refused naming the folder.

The kills are ``os._exit`` at named points of a save, in a child process (``ddp_worker.py``'s ``kill_save``).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from procap.core.errors import ProCapError
from procap.train import stage1
from procap.train.config import TrainConfig
from procap.train.loop import JsonlLog
from procap.train.state import state_paths
from tests.support import subprocess_env
from tests.train.ddp_worker import KILLED, small_model_builder

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("ddp_worker.py")
# saves at steps 2, 4 and 6 (twice at 6: the periodic save and the final one)
RUN = {"steps": 6, "batch_size": 4, "lr": 1e-3, "warmup_steps": 2, "save_every": 2, "seed": 5}


def _config(out: Path, **kw) -> TrainConfig:
    return TrainConfig(stage="pretrain", out=str(out), progress=False, log_every=1, device="cpu", **RUN, **kw)


def _pretrain(out: Path, pairs, vocab, **kw) -> None:
    """The worker's run in this process: the same 16 px model and options."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(stage1, "new_model", small_model_builder({}))
        stage1.pretrain(_config(out, **kw), pairs=pairs, vocab=vocab)


def _losses(out: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in JsonlLog(out / "log.jsonl").records() if "loss" in r}


def _hidden(folder: Path) -> list[str]:
    """What a save leaves beside a run's files: staging folders, temporary files."""
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


@pytest.fixture(scope="module")
def reference(tmp_path_factory, train_pairs, vocab) -> Path:
    """The uninterrupted run, on one thread as the killed worker and the resumed run are: a module fixture is set up
    before the suite's one-thread fixture, and two threads sum in another order (1e-6 apart after six steps)."""
    out = tmp_path_factory.mktemp("torn") / "reference"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _pretrain(out, train_pairs, vocab)
    finally:
        torch.set_num_threads(threads)
    return out


def test_a_completed_save_leaves_nothing_beside_the_run(reference):
    assert _hidden(reference) == []
    assert json.loads(state_paths(reference / "last.safetensors")[1].read_text())["step"] == 6


@pytest.mark.parametrize(
    ("point", "resumed_at"),
    [
        ("weights", 2),  # killed between the weights and the state of step 4: the save of step 2 is used
        ("moving", 4),  # killed while the committed save of step 4 was moved into place: it is finished
    ],
)
def test_a_run_killed_inside_a_save_resumes_as_the_uninterrupted_run(
    point, resumed_at, reference, clevr_root, train_pairs, vocab, tmp_path, caplog
):
    out = tmp_path / "killed"
    spec = {"stage": "pretrain", "data": str(clevr_root), "config": {"out": str(out), **RUN}}
    spec["kill_save"] = {"step": 4, "point": point}
    killed = subprocess.run(
        [sys.executable, str(WORKER), json.dumps(spec)],
        cwd=ROOT,
        env=subprocess_env(OMP_NUM_THREADS="1"),
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
    )
    assert killed.returncode == KILLED, killed.stderr[-3000:]
    dead_temp = out / ".last.safetensors.abcd1234.tmp"  # what atomic_write leaves when killed mid-write
    dead_temp.write_bytes(b"half a file")
    left_by_the_kill = _hidden(out)

    _pretrain(out, train_pairs, vocab, resume=True)

    resumed = [r for r in JsonlLog(out / "log.jsonl").records() if "loss" in r and r["step"] > resumed_at]
    expected = _losses(reference)
    assert [r["step"] for r in resumed][-(6 - resumed_at) :] == list(range(resumed_at + 1, 7))
    for record in resumed[-(6 - resumed_at) :]:
        assert record["loss"] == pytest.approx(expected[record["step"]], rel=1e-6, abs=1e-7), record["step"]
    final, uninterrupted = load_file(out / "last.safetensors"), load_file(reference / "last.safetensors")
    apart = {k: float((final[k] - uninterrupted[k]).abs().max()) for k in uninterrupted}
    assert max(apart.values()) <= 1e-6, {k: v for k, v in apart.items() if v > 1e-6}
    assert _hidden(out) == []  # the dead save and the dead temporary file are gone
    assert ".last.safetensors.abcd1234.tmp" in left_by_the_kill
    assert (".last.safetensors.saving" if point == "weights" else ".last.safetensors.saved") in left_by_the_kill
    note = caplog.text  # a logged warning (the command line shows it on stderr)
    assert "killed run" in note and f"holds the save of step {resumed_at}" in note


def _rewrite(path: Path, step: int, change_weights: bool = False) -> None:
    """Rewrite a checkpoint as the weights of another save: its recorded ``step``, and with ``change_weights`` its
    first tensor, differ (either changes its bytes)."""
    with safe_open(str(path), framework="pt") as handle:
        metadata = dict(handle.metadata())
    extra = json.loads(metadata["extra"])
    tensors = load_file(path)
    if change_weights:
        first = next(iter(tensors))
        tensors[first] = tensors[first] + 1
    save_file(tensors, str(path), metadata={**metadata, "extra": json.dumps({**extra, "step": step})})


@pytest.mark.parametrize(
    ("state_records_weights", "weights_step", "change_weights"),
    [
        (True, 6, True),  # other weights under the state's own step: only the recorded hash tells
        (False, 5, False),  # a state from before the hash was recorded: the steps tell
    ],
    ids=["hash", "state-from-before-the-hash"],
)
def test_resume_refuses_weights_of_another_save(
    state_records_weights, weights_step, change_weights, reference, train_pairs, vocab, tmp_path
):
    out = tmp_path / "torn"
    shutil.copytree(reference, out)
    _rewrite(out / "last.safetensors", weights_step, change_weights)  # beside the step-6 state, as a torn save
    if not state_records_weights:
        json_path = state_paths(out / "last.safetensors")[1]
        payload = json.loads(json_path.read_text())
        payload.pop("weights", None)
        json_path.write_text(json.dumps(payload))
    with pytest.raises(ProCapError) as caught:
        _pretrain(out, train_pairs, vocab, resume=True)
    message = str(caught.value)
    assert f"cannot resume from {out}" in message and f"(step {weights_step})" in message and "(step 6)" in message
    assert "\n" not in message
