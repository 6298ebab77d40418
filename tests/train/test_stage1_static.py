"""The 2 x 2 ablation's "stage 1, no queries" cell: stage 2 from a stage-1 checkpoint with k = 0."""

from __future__ import annotations

import pytest
import torch

from procap.core.errors import ProCapError
from procap.loading.checkpoint import load_checkpoint
from procap.model.procap import ProCap, without_procedure_queries
from procap.train.config import TrainConfig
from tests.support import small_training_config


def test_dropping_the_queries_keeps_every_weight_and_the_end_frames_positions(vocab):
    torch.manual_seed(0)
    model = ProCap(small_training_config(len(vocab), num_keyframes=2))
    reduced = without_procedure_queries(model)
    assert reduced.config.num_keyframes == 0 and reduced.config.num_frames == 2
    assert reduced.config.replace(num_keyframes=2) == model.config  # nothing else of the model changes
    full, kept = model.state_dict(), reduced.state_dict()
    assert kept.keys() == full.keys()
    for key in full:
        expected = full[key][[0, -1]] if key == "pos_frame" else full[key]
        assert torch.equal(kept[key], expected), key
    memory = reduced.memory(torch.rand(2, 3, 16, 16), torch.rand(2, 3, 16, 16))
    assert memory.shape[1] == reduced.config.memory_tokens < model.config.memory_tokens


def test_stage2_starts_from_stage1_without_queries(tmp_path, clevr_root, train_pairs, vocab, monkeypatch):
    from procap.train import stage1
    from procap.train.stage2 import train

    # the 16 px test model whatever the preset, with stage 1's k = 2
    monkeypatch.setattr(
        stage1, "new_model", lambda preset, vocab, vqgan, **kw: ProCap(small_training_config(len(vocab), **kw))
    )
    init = stage1.pretrain(
        TrainConfig(stage="pretrain", out=str(tmp_path / "s1"), steps=2, batch_size=4, num_keyframes=2, progress=False),
        pairs=train_pairs,
        vocab=vocab,
    )
    stage1_model, _, _ = load_checkpoint(init)
    common = {"stage": "train", "data": str(clevr_root), "init": str(init), "steps": 2, "batch_size": 4}
    best = train(TrainConfig(out=str(tmp_path / "s2"), num_keyframes=0, progress=False, **common), pairs=train_pairs)
    model, _, _ = load_checkpoint(best)
    assert model.config.num_keyframes == 0 and model.pos_frame.shape[0] == 2
    # stage 2 trained on from stage 1's encoder
    assert not torch.equal(
        model.encoder.layers[0].attn.q_proj.weight, stage1_model.encoder.layers[0].attn.q_proj.weight
    )
    # only k = 0 may differ from the checkpoint's k, and only in stage 2
    with pytest.raises(ProCapError, match="--num-keyframes 1 differs from the 2 of"):
        train(TrainConfig(out=str(tmp_path / "k1"), num_keyframes=1, progress=False, **common), pairs=train_pairs)
    with pytest.raises(ProCapError, match="--num-keyframes 0 differs from the 2 of"):
        stage1.pretrain(
            TrainConfig(stage="pretrain", out=str(tmp_path / "p0"), init=str(init), num_keyframes=0, steps=1),
            pairs=train_pairs,
            vocab=vocab,
        )
