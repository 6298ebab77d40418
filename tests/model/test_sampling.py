"""Sampling: the cached loop equal to the oracle for a seed, greedy at top_k=1 or a cold temperature, the filters
against plain references, the draw against the distribution, bad options refused."""

from __future__ import annotations

import pytest
import torch

from procap.core.errors import ProCapError
from procap.model.decoder import EOS_ID, PAD_ID, greedy_decode
from procap.model.decoding import STRATEGIES, Sampling, resolve_strategy
from procap.model.procap import ProCap
from procap.model.sampling import draw, sample_decode, sample_decode_cached, sampling_distribution
from tests.support import memory_for, small_config, spread_decoder

OPTIONS = [
    {},
    {"temperature": 0.7, "top_k": 5},
    {"top_p": 0.8, "seed": 11},
    {"temperature": 1.5, "top_k": 8, "top_p": 0.9, "seed": 3},
]


@pytest.mark.parametrize("options", OPTIONS, ids=str)
@pytest.mark.parametrize("vocab", [12, 30])  # 12: four words and EOS, so captions end early
def test_cached_sampling_equals_the_oracle(options, vocab):
    decoder = spread_decoder(vocab=vocab, max_len=8)
    memory = memory_for(decoder, 6)
    oracle = sample_decode(decoder, memory, 8, **options)
    assert torch.equal(sample_decode_cached(decoder, memory, 8, **options), oracle)
    # Output format of greedy decoding: EOS included when produced, PAD after it, no suppressed id.
    assert not decoder.suppressed[oracle[oracle != PAD_ID]].any()
    ended = [row.index(EOS_ID) for row in oracle.tolist() if EOS_ID in row[:-1]]
    assert ended or vocab == 30
    for row in oracle.tolist():
        if EOS_ID in row:
            assert all(token == PAD_ID for token in row[row.index(EOS_ID) + 1 :])


def test_the_same_seed_gives_the_same_captions_and_another_seed_others():
    decoder = spread_decoder(vocab=30, max_len=8)
    memory = memory_for(decoder, 6)
    first = sample_decode(decoder, memory, 8, seed=5)
    assert torch.equal(sample_decode(decoder, memory, 8, seed=5), first)
    assert not torch.equal(sample_decode(decoder, memory, 8, seed=6), first)
    # Not greedy decoding in disguise: at temperature 1 this decoder's samples leave the argmax somewhere.
    assert not torch.equal(first, greedy_decode(decoder, memory, 8))


@pytest.mark.parametrize("options", [{"top_k": 1}, {"temperature": 1e-4}, {"temperature": 1e-30}], ids=str)
def test_top_k_one_and_a_cold_temperature_are_greedy(options):
    decoder = spread_decoder(vocab=30, max_len=8)
    memory = memory_for(decoder, 6)
    greedy = greedy_decode(decoder, memory, 8)
    for seed in (0, 1, 2):
        assert torch.equal(sample_decode(decoder, memory, 8, seed=seed, **options), greedy)
        assert torch.equal(sample_decode_cached(decoder, memory, 8, seed=seed, **options), greedy)


def _plain_distribution(row: list[float], suppressed: list[bool], temperature: float, top_k: int, top_p: float):
    """The sampling rule for one row in plain Python: the kept tokens and their renormalised probabilities."""
    import math

    allowed = [i for i, s in enumerate(suppressed) if not s]
    if top_k:
        kth = sorted((row[i] for i in allowed), reverse=True)[min(top_k, len(allowed)) - 1]
        allowed = [i for i in allowed if row[i] >= kth]
    top = max(row[i] for i in allowed)
    weights = {i: math.exp((row[i] - top) / temperature) for i in allowed}
    total = sum(weights.values())
    probs = {i: w / total for i, w in weights.items()}
    kept, held = {}, 0.0
    for i in sorted(probs, key=lambda i: -probs[i]):
        if held >= top_p:
            break
        kept[i] = probs[i]
        held += probs[i]
    total = sum(kept.values())
    return {i: p / total for i, p in kept.items()}


@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p"), [(1.0, 0, 0.5), (0.6, 0, 0.9), (1.3, 7, 0.75), (1.0, 4, 1.0)]
)
def test_the_filters_match_a_plain_reference(temperature, top_k, top_p):
    generator = torch.Generator().manual_seed(4)
    logits = torch.randn(16, 40, generator=generator) * 3
    suppressed = torch.zeros(40, dtype=torch.bool)
    suppressed[[0, 1, 6]] = True
    probs = sampling_distribution(logits, suppressed, temperature, top_k, top_p)
    for row, expected in zip(
        probs, (_plain_distribution(r, suppressed.tolist(), temperature, top_k, top_p) for r in logits.tolist())
    ):
        kept = torch.nonzero(row).view(-1).tolist()
        assert kept == sorted(expected)
        assert 1 <= len(kept) < 40 - 3 or (top_p == 1.0 and not top_k)
        torch.testing.assert_close(row[kept], torch.tensor([expected[i] for i in kept]), rtol=1e-5, atol=1e-6)


def test_the_draw_follows_the_distribution():
    """Evenly spaced numbers through the inverse distribution function land on each token in proportion."""
    probs = torch.tensor([[0.0, 0.5, 0.0, 0.25, 0.25], [0.1, 0.0, 0.0, 0.0, 0.9]])
    draws = 1000
    uniform = (torch.arange(draws) + 0.5) / draws
    tokens = torch.stack([draw(probs, torch.full((2,), float(u))) for u in uniform])
    counts = torch.stack([torch.bincount(tokens[:, r], minlength=5) for r in range(2)]).float() / draws
    torch.testing.assert_close(counts, probs, atol=1.0 / draws, rtol=0)
    assert draw(probs, torch.zeros(2)).tolist() == [1, 0]  # u = 0 never falls on a token of zero probability
    assert draw(probs, torch.full((2,), 1 - 2**-24)).tolist() == [4, 4]


def test_authors_variant_sampling_cached_equals_the_oracle():
    """The authors' decoder ([UNK] the only suppressed id) samples by the same rule through both loops."""
    from procap.model.authors_decoder import AuthorsCaptionDecoder

    config = small_config(
        variant="authors", enc_prefix_tokens=5, enc_activation="quick_gelu", enc_final_norm=False, vocab_size=30
    )
    torch.manual_seed(2)
    decoder = AuthorsCaptionDecoder(config).eval()
    with torch.no_grad():
        for parameter in decoder.parameters():
            if parameter.dim() > 1:
                parameter.normal_(0.0, 0.6)
    memory = torch.randn(4, decoder.memory_len, config.dec_dim)
    for options in OPTIONS:
        oracle = sample_decode(decoder, memory, 8, **options)
        assert torch.equal(sample_decode_cached(decoder, memory, 8, **options), oracle)


def test_the_registry_names_sampling_and_model_generate_takes_it_by_name():
    torch.manual_seed(0)
    model = ProCap(small_config()).eval()
    before, after = torch.rand(3, 3, 16, 16), torch.rand(3, 3, 16, 16)
    assert STRATEGIES["sample"] is Sampling and not Sampling.captured_step
    options = {"temperature": 0.9, "top_p": 0.95, "seed": 4}
    assert resolve_strategy("sample", options) == Sampling(0.9, 0, 0.95, 4)
    by_name = model.generate(before, after, strategy="sample", strategy_options=options)
    memory = model.memory(before, after)
    assert torch.equal(by_name, sample_decode(model.decoder, memory, 8, **Sampling(**options).options()))
    assert torch.equal(model.generate(before, after, strategy=Sampling(**options)), by_name)
    assert torch.equal(model.generate_from_memory(memory, strategy="sample", strategy_options=options), by_name)
    assert torch.equal(
        model.generate(before, after, strategy="beam", num_beams=3), model.generate(before, after, num_beams=3)
    )
    assert torch.equal(model.generate(before, after, strategy="greedy"), model.generate(before, after))


@pytest.mark.parametrize(
    ("strategy", "options", "message"),
    [
        ("sample", {"temperature": 0}, "temperature must be greater than 0, got 0"),
        ("sample", {"temperature": float("inf")}, "temperature must be a finite number"),
        ("sample", {"top_k": -1}, "top_k must be at least 0, got -1"),
        ("sample", {"top_k": 2.0}, "top_k must be an integer, got 2.0"),
        ("sample", {"top_p": 0.0}, "top_p must be greater than 0, got 0.0"),
        ("sample", {"top_p": 1.01}, "top_p must be at most 1, got 1.01"),
        ("sample", {"seed": 2**32}, "seed must be at most 4,294,967,295"),
        ("sample", {"seed": "1"}, "seed must be an integer"),
        ("sample", {"num_beams": 2}, r"strategy sample takes no num_beams \(its options: temperature, top_k"),
        ("greedy", {"seed": 1}, r"strategy greedy takes no seed \(it has none\)"),
        ("nucleus", {}, "strategy must be one of greedy, beam, sample or a decoding strategy, got 'nucleus'"),
        (None, {"top_p": 0.5}, "top_p applies to strategy sample only"),
        (None, {"width": 2}, "width is no option of any decoding strategy"),
        (Sampling(), {"seed": 1}, "strategy is a Sampling object, which holds its options; leave out seed"),
    ],
)
def test_bad_strategies_and_options_are_refused_before_any_work(strategy, options, message):
    model = ProCap(small_config()).eval()
    before, after = torch.rand(1, 3, 16, 16), torch.rand(1, 3, 16, 16)
    with pytest.raises(ProCapError, match=message):
        resolve_strategy(strategy, options)
    with pytest.raises(ProCapError, match=message):
        model.generate(before, after, strategy=strategy, strategy_options=options)
