"""Beam search for the caption decoders, with the beams of every image pair as rows of one batch.

The rule (the OpenNMT beam search that the authors' code ships, with fixed shapes):

- each pair keeps ``num_beams`` hypotheses, rows ``b * num_beams + j`` of a (B * num_beams)-row batch; at the first
  step only beam 0 is alive (the others score -inf), so no hypothesis is found twice;
- a step scores every (alive beam, next token) by its summed log-probability (the decoder's suppressed ids at -inf)
  and keeps the ``num_beams`` best of the pair's ``num_beams * V`` candidates;
- a kept candidate ending in EOS is finished: it competes for the pair's result with the score
  ``log-probability / length ** length_penalty`` (length counts the EOS) and its row dies (-inf) for later steps;
  at the last step every alive hypothesis finishes (without EOS);
- the result is the finished hypothesis of the best score: its tokens, EOS included, PAD after.

With ``num_beams=1`` this is greedy decoding token for token; with ``num_beams`` at least the number of possible
captions it is exhaustive search. Rows never change count, so the cached version reorders its self-attention
caches in place (``index_select`` by the surviving beams' parent rows) and needs no host synchronisation.

Two implementations share :class:`BeamState`: :func:`beam_search` (the oracle: the whole prefix through the decoder
every step) and :func:`beam_search_cached` (the decoder's static KV caches, as ``procap.fast`` uses them). Their
arguments are checked by :class:`procap.model.decoding.BeamSearch`, which calls them (``num_beams`` 1 to
``MAX_BEAMS``: 100000 beams were killed by the kernel for their memory).
"""

from __future__ import annotations

import torch

from procap.model.decoder import BOS_ID, EOS_ID, PAD_ID, CachedDecoder


class BeamState:
    """The hypotheses of ``batch`` pairs x ``num_beams`` beams over ``steps`` decoding steps.

    Attributes:
        scores: (B, K) summed log-probabilities of the alive beams (-inf: dead or not yet used).
        sequences: (B * K, steps) tokens of each row's hypothesis (PAD where not yet decoded).
        best_score: (B,) length-normalised score of each pair's best finished hypothesis.
        best: (B, steps) its tokens.
    """

    def __init__(
        self,
        batch: int,
        num_beams: int,
        steps: int,
        suppressed: torch.Tensor,
        length_penalty: float,
        device: torch.device | str,
    ) -> None:
        self.batch, self.num_beams, self.steps = batch, num_beams, steps
        self.suppressed, self.length_penalty = suppressed, float(length_penalty)
        self.scores = torch.full((batch, num_beams), float("-inf"), device=device)
        self.scores[:, 0] = 0.0
        self.sequences = torch.full((batch * num_beams, steps), PAD_ID, dtype=torch.long, device=device)
        self.best_score = torch.full((batch,), float("-inf"), device=device)
        self.best = torch.full((batch, steps), PAD_ID, dtype=torch.long, device=device)
        self._row_offset = (torch.arange(batch, device=device) * num_beams)[:, None]  # (B, 1)
        self._pairs = torch.arange(batch, device=device)

    def advance(self, logits: torch.Tensor, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Take one step from the (B * K, V) logits of position ``step``.

        Returns:
            ``(parent_rows, tokens)``: (B * K,) the row each new hypothesis extends (reorder caches and prefixes by
            it) and (B * K,) the token each row feeds to the next step.
        """
        b, k = self.batch, self.num_beams
        vocab = logits.shape[-1]
        log_probs = torch.log_softmax(logits.float().masked_fill(self.suppressed, float("-inf")), dim=-1)
        candidates = (self.scores.view(b * k, 1) + log_probs).view(b, k * vocab)
        top_scores, top_index = candidates.topk(k, dim=1)  # (B, K), best first
        tokens = top_index % vocab
        parent_rows = (torch.div(top_index, vocab, rounding_mode="floor") + self._row_offset).view(-1)
        self.sequences = self.sequences.index_select(0, parent_rows)
        self.sequences[:, step] = tokens.view(-1)
        alive = top_scores > float("-inf")
        finished = alive if step == self.steps - 1 else alive & (tokens == EOS_ID)
        normalised = (top_scores / float(step + 1) ** self.length_penalty).masked_fill(~finished, float("-inf"))
        candidate_score, candidate_beam = normalised.max(dim=1)
        better = candidate_score > self.best_score
        chosen = self.sequences.view(b, k, self.steps)[self._pairs, candidate_beam]
        self.best = torch.where(better[:, None], chosen, self.best)
        self.best_score = torch.where(better, candidate_score, self.best_score)
        self.scores = top_scores.masked_fill(finished, float("-inf"))
        return parent_rows, tokens.view(-1)


def _beam_rows(memory: torch.Tensor, num_beams: int) -> torch.Tensor:
    """(B, N, D) -> (B * K, N, D): each pair's memory repeated for its beams (rows ``b * K + j``)."""
    return memory.repeat_interleave(num_beams, dim=0)


@torch.no_grad()
def beam_search(
    decoder: CachedDecoder, memory: torch.Tensor, max_len: int, num_beams: int, length_penalty: float = 1.0
) -> torch.Tensor:
    """Beam search recomputing every prefix (the oracle): (B, N, D) memory -> (B, max_len - 1) tokens.

    Each step runs the PAD-filled (B * K, max_len) token buffer through ``decoder`` and reads position ``step``;
    both decoders are causal, so the padding after it changes nothing. ``decoder.suppressed`` are never produced.
    """
    rows = _beam_rows(memory, num_beams)
    state = BeamState(memory.shape[0], num_beams, max_len - 1, decoder.suppressed, length_penalty, memory.device)
    ids = torch.full((rows.shape[0], max_len), PAD_ID, dtype=torch.long, device=memory.device)
    ids[:, 0] = BOS_ID
    for step in range(max_len - 1):
        logits = decoder(ids, rows)[:, step]
        parents, tokens = state.advance(logits, step)
        ids = ids.index_select(0, parents)
        ids[:, step + 1] = tokens
    return state.best


@torch.no_grad()
def beam_search_cached(
    decoder: CachedDecoder, memory: torch.Tensor, max_len: int, num_beams: int, length_penalty: float = 1.0
) -> torch.Tensor:
    """Beam search with the decoder's static KV caches: equal to :func:`beam_search`, one position per step.

    The cross-attention caches are filled once for the B * K rows; after each step the self-attention caches
    follow the surviving hypotheses (rows re-gathered by parent in place).
    """
    rows = _beam_rows(memory, num_beams)
    decoding = decoder.setup_caches(rows.shape[0], max_len, rows.dtype, rows.device, rows.shape[1])
    decoder.prefill(rows, decoding)
    state = BeamState(memory.shape[0], num_beams, max_len - 1, decoder.suppressed, length_penalty, memory.device)
    tokens = decoding.tokens
    for step in range(max_len - 1):
        logits = decoder.step_logits(tokens, decoding)
        parents, tokens = state.advance(logits, step)
        decoding.reorder_rows(parents)
        decoding.pos += 1
    return state.best
