"""Beam search: greedy at one beam, exhaustive search with enough beams, the cached loop equal to the oracle."""

from __future__ import annotations

import itertools

import pytest
import torch

from procap.core.errors import ProCapError
from procap.model.beam import beam_search, beam_search_cached
from procap.model.decoder import BOS_ID, EOS_ID, PAD_ID, CaptionDecoder, greedy_decode
from procap.model.procap import ProCap
from tests.support import PeakMemory, memory_for, small_config, spread_decoder

VOCAB = 12  # 8 specials + 4 words: 5 tokens can be produced (the words and EOS)
MAX_LEN = 4  # BOS + 3 decoded tokens: 1 + 4 + 16 + 64 = 85 possible captions


@torch.no_grad()
def caption_log_prob(decoder: CaptionDecoder, memory: torch.Tensor, caption: tuple[int, ...]) -> float:
    """Summed log-probability of ``caption`` (tokens after BOS) for one memory (1, N, D), suppressed ids at -inf."""
    ids = torch.tensor([[BOS_ID, *caption]])
    logits = decoder(ids[:, :-1], memory).float().masked_fill(decoder.suppressed, float("-inf"))
    log_probs = torch.log_softmax(logits, dim=-1)[0]
    return float(sum(log_probs[i, token] for i, token in enumerate(caption)))


def brute_force(decoder: CaptionDecoder, memory: torch.Tensor, length_penalty: float) -> list[int]:
    """The best caption of every possible one (each ends at its first EOS, or runs to the last step)."""
    steps = MAX_LEN - 1
    producible = [t for t in range(VOCAB) if not bool(decoder.suppressed[t])]
    words = [t for t in producible if t != EOS_ID]
    captions = [(*w, EOS_ID) for n in range(steps) for w in itertools.product(words, repeat=n)]
    captions += list(itertools.product(words, repeat=steps))
    best = max(captions, key=lambda c: caption_log_prob(decoder, memory, c) / len(c) ** length_penalty)
    return list(best) + [PAD_ID] * (steps - len(best))


@pytest.mark.parametrize("length_penalty", [0.0, 1.0])
def test_enough_beams_find_the_best_caption_of_all(length_penalty):
    decoder = spread_decoder()
    memory = memory_for(decoder, 6)
    found = beam_search(decoder, memory, MAX_LEN, num_beams=85, length_penalty=length_penalty)
    expected = [brute_force(decoder, memory[i : i + 1], length_penalty) for i in range(6)]
    assert found.tolist() == expected
    # Only meaningful where greedy misses the best caption (this seed: two pairs of six for either penalty).
    assert greedy_decode(decoder, memory, MAX_LEN).tolist() != expected


def test_one_beam_is_greedy():
    decoder = spread_decoder(vocab=30, max_len=8)
    memory = memory_for(decoder, 6)
    for length_penalty in (0.0, 1.0, 2.0):
        assert torch.equal(beam_search(decoder, memory, 8, 1, length_penalty), greedy_decode(decoder, memory, 8))
        assert torch.equal(beam_search_cached(decoder, memory, 8, 1, length_penalty), greedy_decode(decoder, memory, 8))


@pytest.mark.parametrize("num_beams", [2, 3, 5])
def test_cached_beam_search_equals_the_oracle(num_beams):
    decoder = spread_decoder(vocab=30, max_len=8)
    memory = memory_for(decoder, 5)
    oracle = beam_search(decoder, memory, 8, num_beams, 0.7)
    assert torch.equal(beam_search_cached(decoder, memory, 8, num_beams, 0.7), oracle)
    # Output format of greedy decoding: EOS included when produced, PAD after it.
    for row in oracle.tolist():
        if EOS_ID in row:
            end = row.index(EOS_ID)
            assert all(token == PAD_ID for token in row[end + 1 :])


def test_model_generate_takes_beams():
    torch.manual_seed(0)
    model = ProCap(small_config()).eval()
    before, after = torch.rand(2, 3, 16, 16), torch.rand(2, 3, 16, 16)
    assert torch.equal(model.generate(before, after, num_beams=1), model.generate(before, after))
    memory = model.memory(before, after)
    assert torch.equal(model.generate(before, after, num_beams=3), beam_search(model.decoder, memory, 8, 3))
    with pytest.raises(ProCapError, match="num_beams"):
        model.generate(before, after, num_beams=0)


def test_authors_variant_beams_cached_equal_the_oracle():
    """The authors' decoder (post-LN, [UNK] the only suppressed id) runs the same beam rule through both loops."""
    from procap.model.authors_decoder import AuthorsCaptionDecoder

    config = small_config(
        authors={"enabled": True, "prefix_tokens": 5, "final_norm": False}, enc_activation="quick_gelu", vocab_size=30
    )
    torch.manual_seed(2)
    decoder = AuthorsCaptionDecoder(config).eval()
    with torch.no_grad():
        for parameter in decoder.parameters():
            if parameter.dim() > 1:
                parameter.normal_(0.0, 0.6)
    memory = torch.randn(4, decoder.memory_len, config.dec_dim)
    oracle = beam_search(decoder, memory, 8, 3)
    assert torch.equal(beam_search_cached(decoder, memory, 8, 3), oracle)


def test_strategies_are_one_object_each():
    from procap.model.decoding import STRATEGIES, BeamSearch, Greedy, decoding_strategy

    assert decoding_strategy() == Greedy() and decoding_strategy(4, 0.5) == BeamSearch(4, 0.5)
    assert set(STRATEGIES) == {"greedy", "beam", "sample"} and STRATEGIES["beam"] is BeamSearch
    assert Greedy.captured_step and not BeamSearch.captured_step
    with pytest.raises(ProCapError, match="num_beams must be at least 1, got 0"):
        BeamSearch(0)
    with pytest.raises(ProCapError, match="num_beams must be an integer, got 2.5"):
        BeamSearch(2.5)
    with pytest.raises(ProCapError, match="length_penalty must be a finite number"):
        decoding_strategy(2, float("nan"))


def test_the_beam_count_is_bounded_before_any_work():
    """100000 beams grew to 22.9 GB before the kernel killed the process: the range is checked first."""
    from procap.core.config import MAX_BEAMS
    from procap.model.decoding import BeamSearch, decoding_strategy

    assert decoding_strategy(MAX_BEAMS) == BeamSearch(MAX_BEAMS)
    model = ProCap(small_config()).eval()
    before, after = torch.rand(1, 3, 16, 16), torch.rand(1, 3, 16, 16)
    for refused in (
        lambda: decoding_strategy(MAX_BEAMS + 1),
        lambda: BeamSearch(100_000),
        lambda: model.generate(before, after, num_beams=100_000),
    ):
        with (
            PeakMemory() as peak,
            pytest.raises(ProCapError, match=f"num_beams must be at most {MAX_BEAMS}"),
        ):
            refused()
        assert peak.growth < 64 * 2**20


def test_a_strategy_is_the_same_rule_in_both_forms(model):
    from procap.model.decoding import BeamSearch, Greedy, Sampling

    memory = torch.randn(3, model.decoder.memory_len, model.config.dec_dim)
    for strategy in (Greedy(), BeamSearch(3, 0.7), Sampling(0.8, 4, 0.9, seed=7)):
        oracle = strategy.oracle(model.decoder.eval(), memory, 6)
        assert torch.equal(strategy.cached(model.decoder, memory, 6), oracle)
        assert torch.equal(model.generate_from_memory(memory, 6, strategy=strategy), oracle)
