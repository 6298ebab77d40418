"""The decoder's KV-cached decoding (what procap.fast captures) against its full recomputation (the oracle)."""

from __future__ import annotations

import torch

from procap.model.decoder import BOS_ID, greedy_decode, suppress_specials
from procap.model.kv_cache import KVCache


def test_kv_cache_update_and_visibility():
    cache = KVCache(batch=3, heads=2, length=5, head_dim=4, dtype=torch.float32, device="cpu")
    other = KVCache(batch=3, heads=2, length=5, head_dim=4, dtype=torch.float32, device="cpu")
    k_new, v_new = torch.randn(3, 2, 1, 4), torch.randn(3, 2, 1, 4)
    k, v = cache.update(torch.tensor([2]), k_new, v_new)
    assert torch.equal(k[:, :, 2:3], k_new) and torch.equal(v[:, :, 2:3], v_new)
    assert torch.equal(other.k, torch.zeros_like(other.k))  # other layers' caches untouched
    assert cache.visible(torch.tensor([2])).view(-1).tolist() == [True, True, True, False, False]


def test_cached_step_logits_match_full_recompute(trained, pairs):
    model, _, _ = trained
    before, after = pairs
    with torch.no_grad():
        memory = model.memory(before, after)
    model.set_attention_backend("math")
    try:
        decoder = model.decoder
        state = decoder.setup_caches(memory.shape[0], 12, torch.float32, "cpu", memory_len=memory.shape[1])
        decoder.prefill(memory, state)
        prefix = torch.full((memory.shape[0], 1), BOS_ID, dtype=torch.long)
        for _ in range(state.steps):
            decoder.decode_step(state)
            with torch.no_grad():
                full = suppress_specials(decoder(prefix, memory)[:, -1].float())
            finite = torch.isfinite(full)
            assert torch.equal(finite, torch.isfinite(state.logits))
            torch.testing.assert_close(state.logits[finite], full[finite], atol=2e-5, rtol=1e-5)
            prefix = torch.cat([prefix, state.out[:, state.pos - 1]], dim=1)
        assert torch.equal(state.out, greedy_decode(decoder, memory, 12))
        assert torch.equal(decoder.generate_cached(memory, 12), state.out)
    finally:
        model.set_attention_backend("auto")


def test_prefill_resets_state(trained, pairs):
    model, _, _ = trained
    with torch.no_grad():
        memory = model.memory(*pairs)
    decoder = model.decoder
    state = decoder.setup_caches(memory.shape[0], 8, torch.float32, "cpu")
    decoder.prefill(memory, state)
    for _ in range(state.steps):
        decoder.decode_step(state)
    first = state.out.clone()
    decoder.prefill(memory, state)
    assert int(state.pos) == 0 and not state.finished.any() and (state.tokens == BOS_ID).all()
    for _ in range(state.steps):
        decoder.decode_step(state)
    assert torch.equal(state.out, first)
