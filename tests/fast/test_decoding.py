"""KV-cached single-position decoding against the decoder's full recomputation (the oracle)."""

from __future__ import annotations

import torch

from procap.fast.decoding import DecodeState
from procap.fast.kv_cache import StaticKVCache
from procap.model.decoder import BOS_ID, greedy_decode, suppress_specials


def test_kv_cache_update_and_visibility():
    cache = StaticKVCache(
        layers=2, batch=3, heads=2, max_steps=5, head_dim=4, dtype=torch.float32, device=torch.device("cpu")
    )
    k_new, v_new = torch.randn(3, 2, 1, 4), torch.randn(3, 2, 1, 4)
    k, v = cache.update(1, torch.tensor([2]), k_new, v_new)
    assert torch.equal(k[:, :, 2:3], k_new) and torch.equal(v[:, :, 2:3], v_new)
    assert torch.equal(cache.k[0], torch.zeros_like(cache.k[0]))  # other layers untouched
    assert cache.visible(torch.tensor([2])).view(-1).tolist() == [True, True, True, False, False]


def test_cached_step_logits_match_full_recompute(trained, pairs):
    model, _, _ = trained
    before, after = pairs
    with torch.no_grad():
        memory = model.memory(before, after)
    state = DecodeState(
        model.decoder,
        batch=memory.shape[0],
        memory_tokens=memory.shape[1],
        max_len=12,
        dtype=torch.float32,
        device=torch.device("cpu"),
        backend="math",
    )
    state.prefill(memory)
    prefix = torch.full((memory.shape[0], 1), BOS_ID, dtype=torch.long)
    for _ in range(state.steps):
        state.step()
        with torch.no_grad():
            full = suppress_specials(model.decoder(prefix, memory)[:, -1].float())
        finite = torch.isfinite(full)
        assert torch.equal(finite, torch.isfinite(state.logits))
        torch.testing.assert_close(state.logits[finite], full[finite], atol=2e-5, rtol=1e-5)
        prefix = torch.cat([prefix, state.out[:, state.pos - 1]], dim=1)
    assert torch.equal(state.out, greedy_decode(model.decoder, memory, 12))


def test_prefill_resets_state(trained, pairs):
    model, _, _ = trained
    with torch.no_grad():
        memory = model.memory(*pairs)
    state = DecodeState(model.decoder, memory.shape[0], memory.shape[1], 8, torch.float32, torch.device("cpu"))
    state.prefill(memory)
    for _ in range(state.steps):
        state.step()
    first = state.out.clone()
    state.prefill(memory)
    assert int(state.pos) == 0 and not state.finished.any() and (state.tokens == BOS_ID).all()
    for _ in range(state.steps):
        state.step()
    assert torch.equal(state.out, first)
