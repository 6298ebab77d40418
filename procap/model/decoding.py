"""Decoding strategies: how a caption decoder's tokens are chosen, one object per rule.

A strategy holds its settings and gives two forms of the same rule over any
:class:`~procap.model.decoder.CachedDecoder`:

- :meth:`~DecodingStrategy.oracle`: eager, the whole prefix through the decoder every step (``ProCap.generate``);
- :meth:`~DecodingStrategy.cached`: the decoder's static KV caches (``procap.fast.Captioner`` off its graphs).

``captured_step`` says whether the cached form is the decoder's own fixed-shape greedy step, which
``procap.fast`` pads to buckets and captures in CUDA graphs (greedy decoding); any other strategy runs its cached
form eagerly there. :class:`ProCap`, the Captioner and the commands take a strategy (or build one with
:func:`decoding_strategy` from ``--beams`` / ``--length-penalty``), so a new rule (sampling, say) is a class here and
a line in :data:`STRATEGIES`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Protocol

import torch

from procap.model.beam import beam_search, beam_search_cached, check_beam_arguments


class DecodingStrategy(Protocol):
    """The interface every strategy offers (both forms return (B, max_len - 1) int64 tokens after BOS)."""

    name: ClassVar[str]
    captured_step: ClassVar[bool]

    def oracle(self, decoder: torch.nn.Module, memory: torch.Tensor, max_len: int) -> torch.Tensor: ...

    def cached(self, decoder: torch.nn.Module, memory: torch.Tensor, max_len: int) -> torch.Tensor: ...


@dataclass(frozen=True)
class Greedy:
    """The decoder's greedy rule (its ``greedy_oracle``; the cached loop is its ``decode_step``)."""

    name: ClassVar[str] = "greedy"
    captured_step: ClassVar[bool] = True

    def oracle(self, decoder: torch.nn.Module, memory: torch.Tensor, max_len: int) -> torch.Tensor:
        return decoder.greedy_oracle(memory, max_len)

    def cached(self, decoder: torch.nn.Module, memory: torch.Tensor, max_len: int) -> torch.Tensor:
        return decoder.generate_cached(memory, max_len)


@dataclass(frozen=True)
class BeamSearch:
    """Beam search (:mod:`procap.model.beam`): ``num_beams`` hypotheses a pair, finished captions ranked by
    log-probability / length ** ``length_penalty``."""

    num_beams: int = 3
    length_penalty: float = 1.0
    name: ClassVar[str] = "beam"
    captured_step: ClassVar[bool] = False

    def __post_init__(self) -> None:
        check_beam_arguments(self.num_beams, self.length_penalty)

    def oracle(self, decoder: torch.nn.Module, memory: torch.Tensor, max_len: int) -> torch.Tensor:
        return beam_search(decoder, memory, max_len, self.num_beams, self.length_penalty)

    def cached(self, decoder: torch.nn.Module, memory: torch.Tensor, max_len: int) -> torch.Tensor:
        return beam_search_cached(decoder, memory, max_len, self.num_beams, self.length_penalty)


STRATEGIES: dict[str, type] = {strategy.name: strategy for strategy in (Greedy, BeamSearch)}


def decoding_strategy(num_beams: int = 1, length_penalty: float = 1.0) -> DecodingStrategy:
    """The strategy the ``num_beams`` / ``length_penalty`` arguments (``--beams``, ``--length-penalty``) ask for:
    greedy for one beam, beam search for more.

    Raises:
        ProCapError: a beam count below 1 or a non-finite length penalty, in one sentence.
    """
    check_beam_arguments(num_beams, length_penalty)
    return Greedy() if num_beams == 1 else BeamSearch(num_beams, float(length_penalty))
