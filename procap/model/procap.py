"""The ProCap model (docs/model.md): frozen VQGAN, procedure encoder, caption decoder, both stages.

Stage 1 (explicit procedure modeling, :meth:`ProCap.stage1_loss`) runs one encoder pass over a batch of 3B
sequences built from B procedures (T = k + 2 frames each) and their captions:

============  ===========================  ==================================  =========================
rows          caption                      frames                              losses read there
============  ===========================  ==================================  =========================
0 .. B-1      own caption                  real frames, masked                 MSM (masked positions),
                                                                               align = 1, csy = 1
B .. 2B-1     caption of sample b-1 (roll)  the same masked frames              align = 0
2B .. 3B-1    own caption                  consistency negative, same mask      csy = 0
============  ===========================  ==================================  =========================

The same mask is used in all three copies, so a pair differs only in what the head must detect. As in the
authors' code, align and csy are averaged over samples that are not fully masked (the ``entire`` scheme leaves
nothing to judge); an align pair also drops out when the rolled caption equals the sample's own (duplicate
captions, batch of one). ``L_PRO = msm_weight * L_msm + align_weight * L_align + csy_weight * L_csy``.

Stage 2 (implicit procedure captioning) feeds ``{e_bef, e_m x k*n, e_aft}`` + axial positions through the same
encoder (no caption, no heads), maps every output through ``memory_mlp`` (Linear, ReLU, Linear, LayerNorm) and
decodes the caption with cross-attention to that memory.

``config.authors.enabled`` builds the architecture of the authors' released checkpoints instead (stage 2
only): their prefix tokens and mask quirk in the encoder (:meth:`SequenceAssembly.with_prefix`), their decoder
(:class:`procap.model.authors_decoder.AuthorsCaptionDecoder`) and their decoding and caption-text rules.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from procap.core import validate
from procap.core.config import ProCapConfig
from procap.core.errors import ProCapError
from procap.data.vocab import Vocabulary
from procap.kernels.masking import MaskParams
from procap.model.authors_decoder import AuthorsAttention, AuthorsCaptionDecoder
from procap.model.checkpoint_file import check_stage_can_caption
from procap.model.decoder import PAD_ID, CaptionDecoder
from procap.model.decoding import DecodingStrategy, resolve_strategy
from procap.model.departures import FRONT_END_MODULES
from procap.model.encoder import ProcedureEncoder
from procap.model.fused_form import FusedChoice, FusedForm, fused_options
from procap.model.layers import MultiHeadAttention, init_transformer_weights
from procap.model.losses import caption_loss, msm_loss, pair_bce
from procap.model.pretrained import PretrainedMixin
from procap.model.sequence import SequenceAssembly
from procap.model.vqgan import VQGAN

# The parts with a fused inference form, in the order ProCap.use_fused chooses them.
FUSED_PARTS = ("vqgan", "encoder", "decoder")


class ProCap(PretrainedMixin, SequenceAssembly, nn.Module):
    """ProCap: change captioning by imagining the change procedure.

    The encoder's input sequences, the departures from the paper (``departures``) and the memory layout are
    :class:`procap.model.sequence.SequenceAssembly`'s; this class adds the losses and generation.

    Attributes:
        vqgan: frozen :class:`VQGAN` (no gradients, always in eval mode).
        encoder: :class:`ProcedureEncoder` (stack, input embeddings, MSM/align/csy heads).
        memory_mlp: encoder outputs (enc_dim) -> decoder memory (dec_dim).
        decoder: :class:`CaptionDecoder`.
        mask_embedding: (enc_dim,) e_m, also the procedure query of stage 2.
        pos_frame, pos_row, pos_col: (T, enc_dim), (H, enc_dim), (W, enc_dim) axial positions.

    Args:
        config: the architecture.
        attention_backend: :data:`procap.kernels.attention.BACKENDS` name used by the encoder and the decoder
            (default ``auto``: the fastest available per device and dtype); see :meth:`set_attention_backend`.
    """

    def __init__(self, config: ProCapConfig, attention_backend: str = "auto") -> None:
        super().__init__()
        self.config = config
        d, grid = config.enc_dim, config.grid_size
        self.vqgan = VQGAN(config.vqgan)
        self.encoder = ProcedureEncoder(config)
        self.memory_mlp = nn.Sequential(
            nn.Linear(d, d), nn.ReLU(), nn.Linear(d, config.dec_dim), nn.LayerNorm(config.dec_dim)
        )
        self.decoder: AuthorsCaptionDecoder | CaptionDecoder = (
            AuthorsCaptionDecoder(config) if config.authors.enabled else CaptionDecoder(config)
        )
        self.mask_embedding = nn.Parameter(torch.empty(d))
        self.pos_frame = nn.Parameter(torch.empty(config.num_frames, d))
        self.pos_row = nn.Parameter(torch.empty(grid, d))
        self.pos_col = nn.Parameter(torch.empty(grid, d))
        enc_std, dec_std = init_stds(config)
        for module, std in ((self.encoder, enc_std), (self.memory_mlp, enc_std), (self.decoder, dec_std)):
            init_transformer_weights(module, std)
        small = [self.mask_embedding, self.pos_frame, self.pos_row, self.pos_col]
        if config.authors.enabled:
            small.append(self.encoder.prefix)
        else:
            small += [self.encoder.text_pos, self.encoder.align_token, self.encoder.csy_token]
        if isinstance(self.decoder, CaptionDecoder):  # the paper's decoder (not authors.enabled): learned positions
            nn.init.normal_(self.decoder.pos_embed, std=dec_std)
        for p in small:
            nn.init.normal_(p, std=enc_std)
        self.vqgan.requires_grad_(False)
        self.vqgan.eval()
        self.set_attention_backend(attention_backend)
        # What the checkpoint this model was read from records about itself (read_checkpoint sets both): a stage
        # whose caption decoder is untrained is refused by generate, however the model was loaded.
        self.trained_stage: str | None = None
        self.loaded_from: str | None = None

    def set_attention_backend(self, backend: str) -> None:
        """Run every encoder and decoder attention layer with ``backend`` from now on (``auto``, ``math``, ...)."""
        for module in self.modules():
            if isinstance(module, (MultiHeadAttention, AuthorsAttention)):
                module.set_backend(backend)
        self.attention_backend = backend

    def use_fused(self, enabled: bool = True, **choices: FusedChoice) -> None:
        """Choose the fused inference form of every part that has one, or with ``enabled=False`` the readable forms.

        The one switch ``procap.fast.Captioner`` calls: each part's :meth:`use_fused`
        (:mod:`procap.model.fused_form`) with its own choice. A fused form may hold buffers derived from the weights
        of this moment (the VQGAN's): choose it after the model is moved and cast, and switch back before changing
        the weights.

        Args:
            enabled: False chooses the readable form of every part, whatever ``choices`` say.
            choices: per part, ``vqgan``, ``encoder`` or ``decoder``: True (the default: its fused form), False (its
                readable form) or a dict of its fused form's options, e.g. ``vqgan={"channels_last": True}``. A part
                with one form only (the ``authors`` variant's decoder) takes True or False and keeps it.

        Raises:
            ProCapError: an unknown part, a choice of another type, or an option the part does not have.
        """
        unknown = sorted(set(choices) - set(FUSED_PARTS))
        if unknown:
            raise ProCapError(f"use_fused has no part {unknown[0]!r}; its parts: {', '.join(FUSED_PARTS)}.")
        chosen: list[tuple[FusedForm, dict | None]] = []
        for name in FUSED_PARTS:  # every choice checked before any part changes
            options = fused_options(choices.get(name, True), name) if enabled else None
            part = getattr(self, name)
            if isinstance(part, FusedForm):
                part.check_fused_options(options is not None, options or {})
                chosen.append((part, options))
            elif options:
                raise ProCapError(f"this model's {name} has no fused form to take the options {sorted(options)}.")
        for part, options in chosen:
            part.use_fused(options is not None, **(options or {}))

    def train(self, mode: bool = True) -> ProCap:
        """Set train/eval mode; the VQGAN stays in eval mode (it is a frozen tokenizer)."""
        super().train(mode)
        self.vqgan.eval()
        return self

    def restart_front_end(self, seed: int) -> list[str]:
        """Draw the encoder's front end anew: the weights a new model of this config starts from under ``seed``.

        The front end is :data:`procap.model.departures.FRONT_END_MODULES`, what embeds the frames before the
        transformer stack; the stack, the positions, e_m, the heads and the decoder keep their weights. Stage 2 calls
        it when it starts from a stage-1 checkpoint under ``departures.restart_front_end`` (docs/model.md). The
        global random state is left as it was.

        Returns:
            The names of the parameters and buffers restarted.
        """
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            fresh = ProCap(self.config).state_dict()
        restarted = []
        with torch.no_grad():
            for name, tensor in self.state_dict().items():
                owner, _, rest = name.partition(".")
                if owner == "encoder" and rest.split(".")[0] in FRONT_END_MODULES:
                    tensor.copy_(fresh[name])
                    restarted.append(name)
        return restarted

    # -- stage 1 --------------------------------------------------------------------------------------------------
    def stage1_loss(
        self,
        frames: torch.Tensor,
        captions: torch.Tensor,
        codes: torch.Tensor | None = None,
        mask_params: MaskParams | None = None,
        generator: torch.Generator | None = None,
    ) -> dict[str, torch.Tensor]:
        """L_PRO on a batch of procedures (see the module docstring for which row gets which loss).

        Args:
            frames: (B, T, 3, S, S) in [0, 1]: before, k keyframes, after.
            captions: (B, L) int64 caption ids (BOS ... EOS PAD...), L <= max_caption_len.
            codes: optional (B, T*n) precomputed MSM targets (:meth:`frame_codes`).
            mask_params: optional masks (default: drawn with ``config.masking``).
            generator: optional generator for the masks (on the frames' device) and the negatives (CPU).

        Returns:
            ``loss``, ``msm``, ``align``, ``csy`` and ``msm_acc``, ``align_acc``, ``csy_acc``, ``masked_fraction``.
        """
        if self.config.authors.enabled:
            raise ProCapError(
                "the authors variant is a stage-2 model (converted checkpoints); it has no stage-1 "
                "heads, so stage 1 cannot train it."
            )
        self._check_frames(frames)
        codes = self.frame_codes(frames) if codes is None else codes
        seq, mask = self._stage1_sequences(frames, captions, mask_params, generator)
        return self._stage1_losses(self.encoder(seq), captions, codes, mask)

    def _stage1_losses(
        self, out: torch.Tensor, captions: torch.Tensor, codes: torch.Tensor, mask: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        """Heads and losses on the encoder output (3B, 2 + L + N, D); see the module docstring's table."""
        b, length = captions.shape
        enc = self.encoder
        # MSM head on every position, weighted by the mask: a boolean gather would wait on the device for its size.
        visual = out[:b, length + 2 : length + 2 + mask.shape[1]]  # a change token, if any, comes after
        logits = enc.msm_head(visual)
        cells = self.departures.token_merge**2  # one code per merged latent cell
        msm, msm_acc = msm_loss(
            logits.reshape(b, -1, logits.shape[-1] // cells),
            self.msm_targets(codes),
            mask.repeat_interleave(cells, dim=1),
        )
        judged = ~mask.all(dim=1)  # fully masked samples carry no evidence for align/csy
        true_negative = (captions != captions.roll(1, dims=0)).any(dim=1)
        align, align_acc = pair_bce(
            enc.align_head(out[:b, 0]).squeeze(-1),
            enc.align_head(out[b : 2 * b, 0]).squeeze(-1),
            judged & true_negative,
        )
        csy, csy_acc = pair_bce(
            enc.csy_head(out[:b, length + 1]).squeeze(-1), enc.csy_head(out[2 * b :, length + 1]).squeeze(-1), judged
        )
        c = self.config
        loss = c.msm_weight * msm + c.align_weight * align + c.csy_weight * csy
        return {
            "loss": loss,
            "msm": msm.detach(),
            "align": align.detach(),
            "csy": csy.detach(),
            "msm_acc": msm_acc,
            "align_acc": align_acc,
            "csy_acc": csy_acc,
            "masked_fraction": mask.float().mean(),
        }

    # -- stage 2 --------------------------------------------------------------------------------------------------
    def memory(self, before: torch.Tensor, after: torch.Tensor, frames: torch.Tensor | None = None) -> torch.Tensor:
        """Decoder memory from procedure queries (implicit), or from real frames when given (explicit).

        Args:
            before, after: (B, 3, S, S) in [0, 1] (ignored when ``frames`` is given).
            frames: optional (B, T, 3, S, S) procedure frames (before, k keyframes, after).

        Returns:
            (B, T*n, dec_dim).
        """
        if frames is not None:
            self._check_frames(frames)
            tokens = self.frame_tokens(frames)
        else:
            s = self.config.image_size
            for name, image in (("before", before), ("after", after)):
                if image.dim() != 4 or image.shape[1:] != (3, s, s):
                    raise ProCapError(f"{name} images must have shape (B, 3, {s}, {s}), got {tuple(image.shape)}.")
            tokens = self.procedure_tokens(before, after)
        return self.memory_mlp(self.encode_memory(tokens))

    def stage2_loss(
        self, before: torch.Tensor, after: torch.Tensor, captions: torch.Tensor, frames: torch.Tensor | None = None
    ) -> dict[str, torch.Tensor]:
        """Teacher-forced caption loss: ``captions[:, :-1] -> captions[:, 1:]``, PAD ignored, label smoothing.

        Returns:
            ``{"loss", "accuracy", "memory_std"}`` (the memory's standard deviation across the batch, averaged
            over tokens and channels: a collapse detector).
        """
        memory = self.memory(before, after, frames)
        logits = self.decoder(captions[:, :-1], memory)
        loss, accuracy = caption_loss(logits, captions[:, 1:], PAD_ID, self.config.label_smoothing)
        # Across-sample spread of the memory: it falls towards 0 when the memory collapses to a constant.
        spread = memory.detach().float().std(dim=0).mean() if memory.shape[0] > 1 else memory.new_zeros(())
        return {"loss": loss, "accuracy": accuracy, "memory_std": spread}

    @torch.no_grad()
    def generate_from_memory(
        self,
        memory: torch.Tensor,
        max_len: int | None = None,
        num_beams: int | None = None,
        length_penalty: float | None = None,
        strategy: str | DecodingStrategy | None = None,
        strategy_options: Mapping[str, Any] | None = None,
    ) -> torch.Tensor:
        """Captions from a decoder memory (B, N, dec_dim) -> (B, max_len - 1); see :meth:`generate`."""
        self.check_can_caption()
        strategy = resolve_strategy(strategy, strategy_options, num_beams=num_beams, length_penalty=length_penalty)
        ceiling = self.config.max_caption_len
        checked = validate.caption_length(max_len, "max_len", ceiling=ceiling, default=ceiling)
        length = ceiling if checked is None else checked  # None only when the default is
        was_training = self.training
        self.eval()
        try:
            return strategy.oracle(self.decoder, memory, length)
        finally:
            self.train(was_training)

    @torch.no_grad()
    def generate(
        self,
        before: torch.Tensor,
        after: torch.Tensor,
        max_len: int | None = None,
        frames: torch.Tensor | None = None,
        num_beams: int | None = None,
        length_penalty: float | None = None,
        strategy: str | DecodingStrategy | None = None,
        strategy_options: Mapping[str, Any] | None = None,
    ) -> torch.Tensor:
        """Greedy, beam-search or sampled captions (the oracle for ``procap.fast``): eager, full prefix recomputed
        every step.

        Args:
            before, after: (B, 3, S, S) in [0, 1].
            max_len: caption length including BOS (default ``config.max_caption_len``).
            frames: optional explicit procedure frames (B, T, 3, S, S).
            num_beams: the short form of beam search: 1 decodes greedily; more runs
                :func:`procap.model.beam.beam_search` with that many beams.
            length_penalty: beam search ranks finished captions by log-probability / length ** length_penalty.
            strategy: a name of :data:`procap.model.decoding.STRATEGIES` (``"greedy"``, ``"beam"``, ``"sample"``)
                or a strategy object (default greedy, or beams with ``num_beams`` > 1).
            strategy_options: the named strategy's options, e.g. ``{"temperature": 0.7, "top_p": 0.9, "seed": 1}``
                (:func:`procap.model.decoding.resolve_strategy` checks them).

        Returns:
            (B, max_len - 1) int64 tokens after BOS, EOS included, PAD after EOS, [UNK] and other specials
            never produced. Runs in eval mode (dropout off) and restores the previous mode. The ``authors``
            variant follows their rule instead: every step decoded (tokens after EOS kept), only [UNK] suppressed;
            with beams or sampling both variants stop each caption at EOS.
        """
        self.check_can_caption()  # refused before the images are encoded, as are the arguments below
        strategy = resolve_strategy(strategy, strategy_options, num_beams=num_beams, length_penalty=length_penalty)
        was_training = self.training
        self.eval()
        try:
            memory = self.memory(before, after, frames)
            return self.generate_from_memory(memory, max_len, strategy=strategy)
        finally:
            self.train(was_training)

    def check_can_caption(self) -> None:
        """Refuse to caption with weights whose checkpoint records a stage that leaves the decoder untrained
        (a stage-1 checkpoint loaded by hand captioned '' without an error); :attr:`trained_stage` is ``None`` for
        a model built in memory or read from a file that records no stage, and then passes.

        Raises:
            ProCapError: naming the checkpoint and its stage.
        """
        check_stage_can_caption(self.trained_stage, self.loaded_from or "of this model")

    def caption_text(self, vocab: Vocabulary, tokens: Sequence[int] | torch.Tensor) -> str:
        """Caption text of one row of :meth:`generate` (the tokens after BOS) with ``vocab``, under the decoder's
        rule (:meth:`procap.model.decoder.CachedDecoder.caption_text`): ``procap`` skips special tokens, ``authors`` keeps them."""
        return self.decoder.caption_text(vocab, tokens)


def without_procedure_queries(model: ProCap) -> ProCap:
    """A k = 0 copy of ``model``: every weight kept, the procedure queries dropped.

    The stage-2 cell "stage 1, no queries" of the paper's 2 x 2 ablation: the encoder a stage-1 run trained on
    procedures, captioning from the before and after frames alone. Only the frame positions depend on k; the copy
    keeps the before and after rows of ``pos_frame`` (the first and the last).
    """
    reduced = ProCap(model.config.replace(num_keyframes=0), attention_backend=model.attention_backend)
    state = model.state_dict()
    state["pos_frame"] = state["pos_frame"][[0, -1]]
    reduced.load_state_dict(state)
    return reduced.to(model.pos_frame.device).train(model.training)


def init_stds(config: ProCapConfig) -> tuple[float, float]:
    """Init std of the encoder side and of the decoder: 0.02 (BERT), or with ``departures.width_scaled_init``
    0.02 * sqrt(paper width / width), which is 0.02 at the paper's widths (768 / 512) and keeps a narrow model's
    attention logits from starting flat (the ``tiny`` preset: 0.049 / 0.040)."""
    if not config.departures.width_scaled_init:
        return 0.02, 0.02
    return 0.02 * math.sqrt(768 / config.enc_dim), 0.02 * math.sqrt(512 / config.dec_dim)


def count_parameters(model: ProCap) -> dict[str, int]:
    """Parameter counts: ``vqgan``, ``encoder`` (stack, input embeddings, heads, e_m, positions), ``decoder``
    (with the memory MLP), ``total``. Works on a model built on the meta device."""
    vqgan = sum(p.numel() for p in model.vqgan.parameters())
    decoder = sum(p.numel() for m in (model.decoder, model.memory_mlp) for p in m.parameters())
    total = sum(p.numel() for p in model.parameters())
    return {"vqgan": vqgan, "encoder": total - vqgan - decoder, "decoder": decoder, "total": total}
