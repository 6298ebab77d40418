"""``departures.restart_front_end``: stage 2 from a stage-1 checkpoint keeps the stack and draws the front end anew."""

from __future__ import annotations

import torch

from procap.loading.checkpoint import load_checkpoint, save_checkpoint
from procap.model.procap import ProCap
from procap.train.config import TrainConfig
from tests.support import small_training_config

FRONT = "encoder.visual_proj.weight"
STACK = "encoder.layers.0.attn.q_proj.weight"


def _pretrained(tmp_path, train_pairs, vocab, monkeypatch, restart: bool):
    from procap.train import stage1

    monkeypatch.setattr(
        stage1,
        "new_model",
        lambda preset, vocab, vqgan, **kw: ProCap(small_training_config(len(vocab), restart_front_end=restart, **kw)),
    )
    config = TrainConfig(stage="pretrain", out=str(tmp_path / "s1"), steps=3, batch_size=4, progress=False)
    return stage1.pretrain(config, pairs=train_pairs, vocab=vocab)


def _start_of_stage2(path, clevr_root, train_pairs, out, **options):
    """Stage 2's weights after one step at a learning rate too small to move them: the weights it started from."""
    from procap.train.stage2 import train

    common = {"stage": "train", "data": str(clevr_root), "init": str(path), "steps": 1, "batch_size": 4, "seed": 5}
    cfg = TrainConfig(out=str(out), lr=1e-12, weight_decay=0.0, progress=False, **common, **options)
    model, _, _ = load_checkpoint(train(cfg, pairs=train_pairs))
    return model.state_dict()


def _fresh(config, seed: int):
    torch.manual_seed(seed)
    return ProCap(config).state_dict()


def test_stage2_from_stage1_restarts_the_front_end(tmp_path, clevr_root, train_pairs, vocab, monkeypatch):
    init = _pretrained(tmp_path, train_pairs, vocab, monkeypatch, restart=True)
    stage1_weights, _, _ = load_checkpoint(init)
    before = stage1_weights.state_dict()
    fresh = _fresh(stage1_weights.config, 5)
    assert not torch.allclose(before[FRONT], fresh[FRONT])  # the check can fail
    for k, out in ((None, "procap"), (0, "static")):  # ProCap and the stage-1 static pair (its queries dropped)
        start = _start_of_stage2(init, clevr_root, train_pairs, tmp_path / out, num_keyframes=k)
        torch.testing.assert_close(start[FRONT], fresh[FRONT], atol=1e-9, rtol=0)
        torch.testing.assert_close(start[STACK], before[STACK], atol=1e-9, rtol=0)
        torch.testing.assert_close(start["mask_embedding"], before["mask_embedding"], atol=1e-9, rtol=0)


def test_other_starts_keep_their_front_end(tmp_path, clevr_root, train_pairs, vocab, monkeypatch):
    # the departure off: stage 1's front end is where stage 2 starts
    init = _pretrained(tmp_path / "off", train_pairs, vocab, monkeypatch, restart=False)
    before, _, _ = load_checkpoint(init)
    start = _start_of_stage2(init, clevr_root, train_pairs, tmp_path / "off" / "s2")
    torch.testing.assert_close(start[FRONT], before.state_dict()[FRONT], atol=1e-9, rtol=0)
    # a stage-2 checkpoint (fine-tuning a captioner) keeps the front end it learned to caption with
    init = _pretrained(tmp_path / "on", train_pairs, vocab, monkeypatch, restart=True)
    model, vocabulary, _ = load_checkpoint(init)
    captioner = save_checkpoint(tmp_path / "captioner.safetensors", model, vocabulary, {"stage": "stage2"})
    start = _start_of_stage2(captioner, clevr_root, train_pairs, tmp_path / "on" / "s2")
    torch.testing.assert_close(start[FRONT], model.state_dict()[FRONT], atol=1e-9, rtol=0)


def test_a_run_from_scratch_starts_from_the_front_end_restart_draws(
    tmp_path, clevr_root, train_pairs, vocab, monkeypatch
):
    """What docs/model.md says of the departure: the front end it draws is the one a run from scratch with the same
    seed starts from, so the cells with and without stage 1 begin from the same front end."""
    from procap.train import stage1
    from procap.train.stage2 import train

    config = small_training_config(len(vocab), restart_front_end=True)
    monkeypatch.setattr(stage1, "new_model", lambda preset, vocab, vqgan, **kw: ProCap(config.replace(**kw)))
    cfg = TrainConfig(
        stage="train", data=str(clevr_root), out=str(tmp_path / "s2"), steps=1, batch_size=4, seed=5, lr=1e-12,
        weight_decay=0.0, progress=False,
    )  # fmt: skip
    model, _, _ = load_checkpoint(train(cfg, pairs=train_pairs))
    torch.testing.assert_close(model.state_dict()[FRONT], _fresh(config, 5)[FRONT], atol=1e-9, rtol=0)
