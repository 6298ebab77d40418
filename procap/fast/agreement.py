"""How far two ways of captioning agree, and the FP8 agreement gate (issue 52).

:func:`agreement` compares two (N, L) token tensors, the reference's EOS bounding each row: the measure of
``bench/bf16_agreement.py`` (bf16 against the fp32 oracle) and of the gate.

The gate: FP8 (``Captioner(precision="fp8")``, optionally with the FP8 cross-attention cache) must give the same
caption as bf16 on at least :data:`GATE_MINIMUM` of a model's pairs. :func:`fp8_agreement` measures it on pairs the
caller gives (a validation split of the model's own data); :func:`fp8_captioner` is the Captioner that checks first
and **refuses** (:class:`~procap.core.errors.ProCapError`, one sentence with the figure) a model that fails. Refused
rather than warned: the check is asked for, so the caller wants the answer to decide on, and a warning in a batch
job's log lets a model whose captions change on more than 3 % of pairs caption a whole dataset. A Captioner built
with ``precision="fp8"`` directly runs as asked, unchecked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from procap.core.errors import ProCapError
from procap.data.vocab import Vocabulary
from procap.fast.captioner import Captioner
from procap.model.decoder import EOS_ID, PAD_ID
from procap.model.procap import ProCap

GATE_MINIMUM = 0.97  # the fraction of pairs whose FP8 caption must equal the bf16 one


def lengths_to_eos(tokens: torch.Tensor) -> torch.Tensor:
    """Tokens per row up to and including EOS (all of them where a row has no EOS)."""
    is_eos = tokens == EOS_ID
    full = torch.full_like(tokens[:, 0], tokens.shape[1])
    return torch.where(is_eos.any(1), is_eos.int().argmax(1) + 1, full)


def agreement(tokens: torch.Tensor, reference: torch.Tensor) -> dict[str, float]:
    """Token-, caption- and prefix-level agreement of two (N, L) token tensors.

    Returns:
        ``pairs``; ``token_agreement``: positions equal to the reference's, over its tokens up to and including its
        EOS; ``caption_agreement``: rows equal as a whole; ``prefix_fraction``: the mean length of the common prefix
        over the reference's length (where the first divergence falls).
    """
    lengths = lengths_to_eos(reference)
    positions = torch.arange(reference.shape[1], device=reference.device)[None, :]
    counted = (positions < lengths[:, None]) & (reference != PAD_ID)
    equal = tokens == reference
    mismatch = (~equal) & counted
    first_diff = torch.where(mismatch.any(1), mismatch.int().argmax(1), lengths)
    return {
        "pairs": int(reference.shape[0]),
        "token_agreement": float((equal & counted).sum() / counted.sum()),
        "caption_agreement": float(equal.all(1).float().mean()),
        "prefix_fraction": float((first_diff.float() / lengths.float()).mean()),
    }


@dataclass(frozen=True)
class Fp8Agreement:
    """The gate's measurement: FP8 captions against bf16 ones on the same pairs and settings.

    Attributes:
        figures: :func:`agreement` of the FP8 tokens against the bf16 ones.
        minimum: the caption agreement the gate asks for.
        bf16_tokens, fp8_tokens: (N, max_len - 1) tokens of both, on the CPU.
        kv_cache_dtype: the FP8 run's cross-attention cache (None: the compute dtype's).
    """

    figures: dict[str, float]
    minimum: float
    bf16_tokens: torch.Tensor
    fp8_tokens: torch.Tensor
    kv_cache_dtype: str | None = None

    @property
    def caption_agreement(self) -> float:
        return self.figures["caption_agreement"]

    @property
    def passed(self) -> bool:
        return self.caption_agreement >= self.minimum

    def require(self) -> None:
        """Raise :class:`ProCapError` (one sentence with the figures) unless the gate passed."""
        if not self.passed:
            raise ProCapError(
                f"FP8 refused for this model: its captions equal the bf16 ones on {self.caption_agreement:.1%} of "
                f"{self.figures['pairs']} pairs, below the gate's {self.minimum:.0%}; caption in bf16."
            )


def fp8_agreement(
    model: ProCap,
    before: torch.Tensor,
    after: torch.Tensor,
    *,
    minimum: float = GATE_MINIMUM,
    kv_cache_dtype: str | None = None,
    **captioner_options: Any,
) -> Fp8Agreement:
    """Caption ``before`` / ``after`` (N, 3, S, S) in bf16 and in FP8 with the same Captioner options; compare.

    Args:
        model: the trained model (copied by each Captioner, left as it is).
        minimum: the caption agreement the gate asks for, in (0, 1].
        kv_cache_dtype: also the FP8 cross-attention cache in the FP8 run.
        captioner_options: the rest of both Captioners' arguments (``device``, ``configure_as``, ``max_len``, ...).
    """
    if not 0.0 < minimum <= 1.0:
        raise ProCapError(f"minimum must be a fraction in (0, 1], got {minimum!r}.")
    if before.shape[0] == 0:
        raise ProCapError("the FP8 gate needs at least one image pair to compare captions on.")
    bf16 = Captioner(model, None, precision="bf16", **captioner_options).generate(before, after).cpu()
    fp8 = Captioner(model, None, precision="fp8", kv_cache_dtype=kv_cache_dtype, **captioner_options)
    fp8_tokens = fp8.generate(before, after).cpu()
    return Fp8Agreement(agreement(fp8_tokens, bf16), minimum, bf16, fp8_tokens, kv_cache_dtype)


def fp8_captioner(
    model: ProCap,
    vocab: Vocabulary | None,
    before: torch.Tensor,
    after: torch.Tensor,
    *,
    minimum: float = GATE_MINIMUM,
    kv_cache_dtype: str | None = None,
    **captioner_options: Any,
) -> Captioner:
    """An FP8 Captioner for ``model``, after the gate passed on ``before`` / ``after`` (:func:`fp8_agreement`).

    Raises:
        ProCapError: the model fails the gate (its figure and the minimum in the sentence).
    """
    gate = fp8_agreement(model, before, after, minimum=minimum, kv_cache_dtype=kv_cache_dtype, **captioner_options)
    gate.require()
    captioner = Captioner(model, vocab, precision="fp8", kv_cache_dtype=kv_cache_dtype, **captioner_options)
    captioner.fp8_gate = gate
    return captioner
