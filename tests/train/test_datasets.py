"""Training datasets, the resumable batch order and the frozen-tokenizer memo."""

from __future__ import annotations

import torch

from procap.data.images import ImageCache
from procap.train.datasets import (
    CrossFadeProcedures,
    EpochBatchSampler,
    PairDataset,
    ProcedureDataset,
    pick_caption,
)


def test_crossfade_frames():
    before, after = torch.zeros(3, 4, 4), torch.ones(3, 4, 4)
    frames = CrossFadeProcedures(2)(None, before, after)
    assert frames.shape == (4, 3, 4, 4)
    assert torch.equal(frames[0], before) and torch.equal(frames[-1], after)
    assert torch.allclose(frames[1], torch.full((3, 4, 4), 1 / 3)) and torch.allclose(
        frames[2], torch.full((3, 4, 4), 2 / 3)
    )
    assert CrossFadeProcedures(0)(None, before, after).shape == (2, 3, 4, 4)


def test_pair_dataset_items(train_pairs, vocab):
    data = PairDataset(train_pairs, vocab, image_size=16, max_len=12, seed=0)
    item = data[0]
    assert item["before"].shape == item["after"].shape == (3, 16, 16)
    assert item["caption"].shape == (12,) and item["caption"][0] == vocab.bos_id
    assert vocab.decode(item["caption"].tolist()) in [
        vocab.decode(vocab.encode(c, 12)) for c in train_pairs[0].captions
    ]
    assert data.cache(train_pairs[0].before_path) is data.cache(train_pairs[0].before_path)  # decoded once


def test_caption_choice_is_per_epoch_and_reproducible():
    captions = [f"caption {i}" for i in range(6)]
    assert pick_caption(captions, 0, 3, 5) == pick_caption(captions, 0, 3, 5)
    assert len({pick_caption(captions, 0, epoch, 5) for epoch in range(30)}) > 1


def test_procedure_dataset(train_pairs, vocab):
    data = ProcedureDataset(train_pairs, vocab, 16, CrossFadeProcedures(1), max_len=12)
    item = data[1]
    assert item["frames"].shape == (3, 3, 16, 16) and "codes" not in item
    assert torch.equal(item["frames"][0], data.base.cache(train_pairs[1].before_path))
    codes = torch.arange(len(train_pairs) * 48).view(len(train_pairs), 48)
    assert torch.equal(
        ProcedureDataset(train_pairs, vocab, 16, CrossFadeProcedures(1), codes=codes)[2]["codes"], codes[2]
    )


def test_batch_sampler_resumes_mid_epoch():
    sampler = EpochBatchSampler(23, 5, seed=4)
    sampler.set_epoch(2)
    full = list(sampler)
    assert len(full) == len(sampler) == 4 and all(len(b) == 5 for b in full)
    sampler.set_epoch(2, start_batch=2)
    assert list(sampler) == full[2:]
    sampler.set_epoch(3)
    assert list(sampler) != full


def test_image_cache_can_be_disabled(train_pairs):
    cache = ImageCache(16, enabled=False)
    a = cache(train_pairs[0].after_path)
    assert a.shape == (3, 16, 16) and len(cache) == 0


def test_memoized_tokenizer_is_exact(model):
    images = torch.rand(5, 3, 16, 16)
    features, codes = model.vqgan.features(images), model.vqgan.codes(images)
    keys = list(model.state_dict())
    memo = model.vqgan.memoize()
    assert list(model.state_dict()) == keys  # the memo is no module: the checkpoint layout stays
    model.vqgan.remember(images[:3])
    # Values match the tokenizer without a memo up to the conv backend's batch-size-dependent rounding.
    assert torch.allclose(model.vqgan.features(images[[4, 0, 2]]), features[[4, 0, 2]], atol=1e-5, rtol=1e-5)
    assert torch.equal(
        model.vqgan.features(images[:3]), torch.stack([memo.tables["features"][k] for k in memo.keys(images[:3])])
    )
    assert (model.vqgan.codes(images) == codes).float().mean() > 0.95
    assert memo.hits >= 5
    shifted = images.flip(1)  # an "augmentation": looked up, computed, not stored
    model.vqgan.features(shifted)
    assert len(memo) == 3 and model.vqgan.memoize() is memo
