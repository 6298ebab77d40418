"""Learning-rate schedules and parameter groups of both stages (paper values at key steps)."""

from __future__ import annotations

import math

import pytest

from procap.train.config import TrainConfig
from procap.train.schedules import is_decoder_param, stage1_optimizer, stage2_optimizer, warmup_lr


def _lrs_at(schedule, step: int) -> list[float]:
    schedule.load_state_dict({"step": step})
    return list(schedule.lrs().values())


def test_warmup_shape():
    assert warmup_lr(0, 1e-6, 1e-4, 100) == 1e-6
    assert warmup_lr(50, 1e-6, 1e-4, 100) == pytest.approx(1e-6 + 0.5 * (1e-4 - 1e-6))
    assert warmup_lr(100, 1e-6, 1e-4, 100) == 1e-4
    assert warmup_lr(10_000, 1e-6, 1e-4, 100) == 1e-4  # paper: constant after warm-up
    assert warmup_lr(0, 0.0, 1.0, 0) == 1.0  # no warm-up


@pytest.mark.parametrize("decay", ["cosine", "linear"])
def test_decay_reaches_zero(decay):
    assert warmup_lr(10, 0.0, 1.0, 10, total_steps=110, decay=decay) == pytest.approx(1.0)
    assert warmup_lr(60, 0.0, 1.0, 10, total_steps=110, decay=decay) == pytest.approx(0.5)
    assert warmup_lr(110, 0.0, 1.0, 10, total_steps=110, decay=decay) == pytest.approx(0.0, abs=1e-12)


def test_stage1_paper_schedule(model):
    cfg = TrainConfig(stage="pretrain").resolved()
    assert (cfg.steps, cfg.batch_size, cfg.lr, cfg.lr_start, cfg.warmup_steps) == (200_000, 8, 1e-4, 1e-6, 5_000)
    optimizer, schedule = stage1_optimizer(model, cfg, cfg.steps)
    assert type(optimizer).__name__ == "AdamW"
    assert _lrs_at(schedule, 0) == [1e-6]
    assert _lrs_at(schedule, 2_500)[0] == pytest.approx(5.05e-5)
    assert _lrs_at(schedule, 5_000) == [1e-4]
    assert _lrs_at(schedule, 150_000) == [1e-4]


def test_stage2_paper_schedule(model):
    cfg = TrainConfig(stage="train", encoder_warmup=False).resolved()
    assert (cfg.epochs, cfg.batch_size, cfg.encoder_lr, cfg.decoder_lr, cfg.warmup_frac) == (40, 16, 5e-5, 5e-5, 0.1)
    _, schedule = stage2_optimizer(model, cfg, total_steps=1_000)
    assert _lrs_at(schedule, 0) == [5e-5, 0.0]
    enc, dec = _lrs_at(schedule, 50)
    assert enc == 5e-5 and dec == pytest.approx(2.5e-5)
    assert _lrs_at(schedule, 100) == [5e-5, 5e-5]
    assert _lrs_at(schedule, 999) == [5e-5, 5e-5]


def test_stage2_encoder_warms_up_with_the_decoder_by_default(model):
    cfg = TrainConfig(stage="train").resolved()
    assert cfg.encoder_warmup
    _, schedule = stage2_optimizer(model, cfg, total_steps=1_000)
    assert _lrs_at(schedule, 0) == [0.0, 0.0]
    enc, dec = _lrs_at(schedule, 50)
    assert enc == pytest.approx(2.5e-5) and dec == pytest.approx(2.5e-5)
    assert _lrs_at(schedule, 100) == [5e-5, 5e-5]


def test_spot_encoder_lr_and_overrides():
    assert TrainConfig(stage="train", dataset="spot-the-diff").resolved().encoder_lr == 2e-5
    cfg = TrainConfig(stage="train", lr=1e-3).resolved()
    assert cfg.encoder_lr == cfg.decoder_lr == 1e-3
    assert TrainConfig(stage="train", steps=10).resolved().epochs is None  # --steps wins over the 40 epochs


def test_stage2_parameter_groups(model):
    cfg = TrainConfig(stage="train").resolved()
    optimizer, _ = stage2_optimizer(model, cfg, 100)
    names = {id(p): n for n, p in model.named_parameters()}
    encoder = {names[id(p)] for p in optimizer.param_groups[0]["params"]}
    decoder = {names[id(p)] for p in optimizer.param_groups[1]["params"]}
    assert {"mask_embedding", "pos_frame", "pos_row", "pos_col"} <= encoder
    assert any(n.startswith("encoder.") for n in encoder) and not any(is_decoder_param(n) for n in encoder)
    assert all(n.startswith(("decoder.", "memory_mlp.")) for n in decoder)
    assert any(n.startswith("memory_mlp.") for n in decoder)
    assert not any(n.startswith("vqgan.") for n in encoder | decoder)  # the tokenizer is frozen


def test_stage1_cosine_option(model):
    cfg = TrainConfig(stage="pretrain", steps=100, warmup_steps=10, lr=1e-3, decay="cosine").resolved()
    _, schedule = stage1_optimizer(model, cfg, 100)
    assert _lrs_at(schedule, 55)[0] == pytest.approx(1e-3 * 0.5 * (1 + math.cos(math.pi * 0.5)))


def test_bad_config_values():
    with pytest.raises(ValueError):
        TrainConfig(stage="finetune")
    with pytest.raises(ValueError):
        TrainConfig(decay="step")


def test_each_parameter_group_logs_its_lr_under_its_name(model):
    stage1 = TrainConfig(stage="pretrain").resolved()
    stage2 = TrainConfig(stage="train").resolved()
    assert list(stage1_optimizer(model, stage1, 10)[1].lrs()) == ["all"]
    assert list(stage2_optimizer(model, stage2, 10)[1].lrs()) == ["encoder", "decoder"]


def test_vqgan_and_stage1_share_the_warmup_schedule():
    from procap.train.vqgan_train import vqgan_optimizer
    from tests.support import tiny_vqgan

    cfg = TrainConfig(stage="vqgan", steps=40, warmup_steps=10, lr=2e-4, lr_start=1e-5, decay="cosine").resolved()
    optimizer, schedule = vqgan_optimizer(tiny_vqgan(), cfg, 40)
    assert type(optimizer).__name__ == "Adam" and optimizer.param_groups[0]["betas"] == (0.5, 0.9)
    for step in (0, 5, 10, 25, 40):
        assert _lrs_at(schedule, step) == [warmup_lr(step, 1e-5, 2e-4, 10, 40, "cosine")]


@pytest.mark.parametrize("stage, field", [("pretrain", "warmup_steps"), ("train", "warmup_frac")])
def test_an_unresolved_config_names_the_field_it_lacks(model, stage, field):
    optimizer = stage1_optimizer if stage == "pretrain" else stage2_optimizer
    with pytest.raises(ValueError, match=r"TrainConfig\.\w+ is None"):
        optimizer(model, TrainConfig(stage=stage), 100)  # not resolved: the paper's values were never filled in
    with pytest.raises(ValueError, match=rf"TrainConfig\.{field} is None"):
        optimizer(model, TrainConfig(stage=stage, lr=1e-4, lr_start=0.0, encoder_lr=1e-4, decoder_lr=1e-4), 100)
