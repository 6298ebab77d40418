"""One way to choose a part's fused inference form: ``part.use_fused(enabled=True, **options)``.

Three parts of the model have a readable form (what trains, and the reference the tests compare with) and a fused
inference form of the same computation on the same weights:

- :class:`procap.model.vqgan.VQGAN`: its encoder, or :class:`procap.model.vqgan_fused.FusedVQGANEncoder` (bias-free
  convolutions, biases added where read); options ``channels_last``, ``downsample_4x4``, ``input_channels``,
  ``conv_in_stats``;
- :class:`procap.model.encoder.ProcedureEncoder`: its stack as written, or each residual add fused with the LayerNorm
  after it (no-grad calls); options ``add_norm``, ``gelu_epilogue``, ``gelu_erf_epilogue``;
- :class:`procap.model.decoder.CaptionDecoder`: its cached decoding interface runs the fused step of
  :mod:`procap.model.decoder_step`, or the readable forward over the whole fixed-length prefix; options
  ``logits_pick``, ``kv_cache_dtype`` (the cross-attention keys/values in e4m3) and ``mlp``.

Each is a :class:`FusedForm`: :meth:`FusedForm.use_fused` checks the options against the part's
:attr:`~FusedForm.fused_options` and hands them to the part's ``_choose_fused``; :attr:`~FusedForm.fused` says which
form is chosen. :meth:`procap.model.procap.ProCap.use_fused` chooses for the three at once with one
:data:`FusedChoice` per part; that is what ``procap.fast.Captioner`` calls.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from procap.core.errors import ProCapError, shown

# One part's choice: False for the readable form, True for the fused form with its defaults, or a mapping of the
# fused form's options (the Captioner's ``fused_vqgan`` / ``fused_encoder`` / ``fused_decoder`` take the same).
FusedChoice = bool | Mapping[str, Any]


def fused_options(choice: Any, name: str) -> dict[str, Any] | None:
    """A :data:`FusedChoice` read: None for the readable form, else the fused form's options (empty for True).

    Raises:
        ProCapError: ``choice`` is neither a bool nor a mapping, in one sentence naming ``name``.
    """
    if isinstance(choice, bool):
        return {} if choice else None
    if isinstance(choice, Mapping):
        return dict(choice)
    raise ProCapError(f"{name} must be True, False or a dict of the fused form's options, got {shown(choice)}.")


class FusedForm:
    """A module with a readable form and a fused inference form of the same computation (module docstring).

    A subclass names its options in :attr:`fused_options` and applies a choice in ``_choose_fused``; the default of
    each option is ``_choose_fused``'s own.
    """

    fused_options: ClassVar[tuple[str, ...]] = ()
    _fused: bool = False  # the readable form until a part says otherwise

    @property
    def fused(self) -> bool:
        """Whether the fused form is chosen."""
        return self._fused

    def use_fused(self, enabled: bool = True, **options: Any) -> None:
        """Choose the fused inference form (with ``options``), or with ``enabled=False`` the readable form.

        Raises:
            ProCapError: an option this part does not have, or options given with ``enabled=False``.
        """
        self.check_fused_options(enabled, options)
        self._choose_fused(bool(enabled), **options)
        self._fused = bool(enabled)

    def check_fused_options(self, enabled: bool, options: Mapping[str, Any]) -> None:
        """Refuse, in one sentence, what :meth:`use_fused` would refuse, before anything is chosen."""
        part = type(self).__name__
        unknown = sorted(set(options) - set(self.fused_options))
        if unknown:
            have = ", ".join(self.fused_options) or "none"
            raise ProCapError(f"{part}.use_fused has no option {unknown[0]!r} (its options: {have}).")
        if options and not enabled:
            raise ProCapError(f"{part}.use_fused(False) takes no options: they set up the fused form.")

    # ``*args: Any, **options: Any`` is how a type checker is told that each part takes its own keywords here
    # (its options, with their defaults); :meth:`use_fused` passes keywords only.
    def _choose_fused(self, enabled: bool, *args: Any, **options: Any) -> None:
        """Apply the choice; ``options`` are checked names of :attr:`fused_options`."""
        raise NotImplementedError
