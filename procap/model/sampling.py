"""Sampling for the caption decoders: each token drawn from the decoder's distribution, reproducibly.

The rule of one step, for every row (:func:`sampling_distribution`, :func:`draw`):

- the decoder's suppressed ids are at -inf (as greedy decoding and beam search have them);
- ``top_k`` > 0 keeps the ``top_k`` highest logits (ties with the k-th kept too), 0 keeps all;
- the softmax of the kept logits / ``temperature`` (the logits' maximum subtracted before the division, so a
  temperature near 0 tends to greedy decoding instead of overflowing);
- ``top_p`` < 1 keeps the most likely tokens, in order, until the ones before a token hold ``top_p`` of the
  probability: the smallest such set (nucleus sampling), renormalised;
- one uniform number ``u`` a row picks the token whose cumulative probability first exceeds ``u`` (the inverse of
  the distribution function), so tokens of zero probability are never drawn;
- a row that produced EOS is finished: PAD after it (as greedy decoding and beam search end a caption).

Every step draws one number per row from a generator seeded with ``seed`` on the memory's device, whether its row
is finished or not, so both loops below consume the same numbers and agree token for token: :func:`sample_decode`
(the oracle: the whole prefix through the decoder every step) and :func:`sample_decode_cached` (the decoder's static
KV caches, as ``procap.fast`` uses them). The numbers follow the rows' order: a pair's caption depends on the seed and
on its row in the batch. ``top_k=1``, or a temperature near 0, is greedy decoding token for token.

The options are checked by :class:`procap.model.decoding.Sampling`, which calls these loops.
"""

from __future__ import annotations

import torch

from procap.model.decoder import BOS_ID, EOS_ID, PAD_ID, CachedDecoder


def sampling_distribution(
    logits: torch.Tensor, suppressed: torch.Tensor, temperature: float, top_k: int, top_p: float
) -> torch.Tensor:
    """(B, V) logits -> (B, V) fp32 probabilities of the next token under the sampling rule (zero where filtered)."""
    scores = logits.float().masked_fill(suppressed, float("-inf"))
    if 0 < top_k < scores.shape[-1]:
        kth = scores.topk(top_k, dim=-1).values[:, -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    probs = torch.softmax((scores - scores.amax(dim=-1, keepdim=True)) / temperature, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        held_before = sorted_probs.cumsum(dim=-1) - sorted_probs  # probability of the tokens ranked above each
        probs = probs.masked_fill((held_before >= top_p).scatter(-1, order, held_before >= top_p), 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def draw(probs: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """(B, V) probabilities and (B,) numbers in [0, 1) -> (B,) int64 tokens: the first whose cumulative probability
    exceeds ``uniform`` x the row's total (never a token of zero probability)."""
    cumulative = probs.cumsum(dim=-1)
    threshold = uniform[:, None] * cumulative[:, -1:]
    return torch.searchsorted(cumulative, threshold, right=True).squeeze(1).clamp_max(probs.shape[-1] - 1)


class SampleState:
    """The captions of ``batch`` rows over ``steps`` sampling steps.

    Attributes:
        out: (B, steps) sampled tokens, PAD after each row's EOS.
        finished: (B,) rows that produced EOS.
    """

    def __init__(
        self,
        batch: int,
        steps: int,
        suppressed: torch.Tensor,
        device: torch.device | str,
        temperature: float,
        top_k: int,
        top_p: float,
        seed: int,
    ) -> None:
        self.suppressed, self.temperature, self.top_k, self.top_p = suppressed, temperature, top_k, top_p
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self.out = torch.full((batch, steps), PAD_ID, dtype=torch.long, device=device)
        self.finished = torch.zeros(batch, dtype=torch.bool, device=device)

    def advance(self, logits: torch.Tensor, step: int) -> torch.Tensor:
        """Sample position ``step`` from the (B, V) logits; returns the (B,) tokens fed to the next step."""
        probs = sampling_distribution(logits, self.suppressed, self.temperature, self.top_k, self.top_p)
        uniform = torch.rand(probs.shape[0], generator=self.generator, device=probs.device)
        tokens = draw(probs, uniform).masked_fill(self.finished, PAD_ID)
        self.finished |= tokens == EOS_ID
        self.out[:, step] = tokens
        return tokens


@torch.no_grad()
def sample_decode(
    decoder: CachedDecoder,
    memory: torch.Tensor,
    max_len: int,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int = 0,
) -> torch.Tensor:
    """Sampling recomputing every prefix (the oracle): (B, N, D) memory -> (B, max_len - 1) tokens."""
    batch = memory.shape[0]
    state = SampleState(batch, max_len - 1, decoder.suppressed, memory.device, temperature, top_k, top_p, seed)
    ids = torch.full((batch, 1), BOS_ID, dtype=torch.long, device=memory.device)
    for step in range(max_len - 1):
        tokens = state.advance(decoder(ids, memory)[:, -1], step)
        ids = torch.cat([ids, tokens[:, None]], dim=1)
    return state.out


@torch.no_grad()
def sample_decode_cached(
    decoder: CachedDecoder,
    memory: torch.Tensor,
    max_len: int,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int = 0,
) -> torch.Tensor:
    """Sampling with the decoder's static KV caches, one position per step: equal to :func:`sample_decode`."""
    batch = memory.shape[0]
    decoding = decoder.setup_caches(batch, max_len, memory.dtype, memory.device, memory.shape[1])
    decoder.prefill(memory, decoding)
    state = SampleState(batch, max_len - 1, decoder.suppressed, memory.device, temperature, top_k, top_p, seed)
    tokens = decoding.tokens
    for step in range(max_len - 1):
        tokens = state.advance(decoder.step_logits(tokens, decoding), step)
        decoding.pos += 1
    return state.out
