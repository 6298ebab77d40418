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

``config.variant == "authors"`` builds the architecture of the authors' released checkpoints instead (stage 2
only): their prefix tokens and mask quirk in the encoder (:meth:`ProcedureEncoder.with_prefix`), their decoder
(:class:`procap.model.authors_decoder.AuthorsCaptionDecoder`) and their decoding and caption-text rules.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from procap import kernels, validate
from procap.config import ProCapConfig
from procap.data.vocab import Vocabulary
from procap.errors import ProCapError
from procap.kernels.masking import MaskParams, axial_positions
from procap.model.authors_decoder import AuthorsAttention, AuthorsCaptionDecoder
from procap.model.checkpoint_file import check_stage_can_caption
from procap.model.decoder import PAD_ID, CaptionDecoder
from procap.model.decoding import DecodingStrategy, decoding_strategy
from procap.model.encoder import ProcedureEncoder, space_to_depth
from procap.model.layers import MultiHeadAttention, init_transformer_weights
from procap.model.losses import caption_loss, msm_loss, pair_bce
from procap.model.masking import sample_mask_params
from procap.model.negatives import consistency_negatives
from procap.model.pretrained import PretrainedMixin
from procap.model.vqgan import VQGAN
from procap.validate import same_device


class ProCap(PretrainedMixin, nn.Module):
    """ProCap: change captioning by imagining the change procedure.

    Attributes:
        vqgan: frozen :class:`VQGAN` (no gradients, always in eval mode).
        encoder: :class:`ProcedureEncoder` (stack, input embeddings, MSM/align/csy heads).
        memory_mlp: encoder outputs (enc_dim) -> decoder memory (dec_dim).
        decoder: :class:`CaptionDecoder`.
        mask_embedding: (enc_dim,) e_m, also the procedure query of stage 2.
        pos_frame, pos_row, pos_col: (T, enc_dim), (H, enc_dim), (W, enc_dim) axial positions.

    Args:
        config: the architecture.
        attention_backend: :data:`procap.attention.BACKENDS` name used by the encoder and the decoder
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
        self.decoder = AuthorsCaptionDecoder(config) if config.variant == "authors" else CaptionDecoder(config)
        self.mask_embedding = nn.Parameter(torch.empty(d))
        self.pos_frame = nn.Parameter(torch.empty(config.num_frames, d))
        self.pos_row = nn.Parameter(torch.empty(grid, d))
        self.pos_col = nn.Parameter(torch.empty(grid, d))
        enc_std, dec_std = init_stds(config)
        for module, std in ((self.encoder, enc_std), (self.memory_mlp, enc_std), (self.decoder, dec_std)):
            init_transformer_weights(module, std)
        small = [self.mask_embedding, self.pos_frame, self.pos_row, self.pos_col]
        if config.variant == "authors":
            small.append(self.encoder.prefix)
        else:
            small += [self.encoder.text_pos, self.encoder.align_token, self.encoder.csy_token]
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

    def train(self, mode: bool = True) -> ProCap:
        """Set train/eval mode; the VQGAN stays in eval mode (it is a frozen tokenizer)."""
        super().train(mode)
        self.vqgan.eval()
        return self

    # -- visual inputs ------------------------------------------------------------------------------------------
    def _check_frames(self, frames: torch.Tensor, what: str = "frames") -> None:
        t, s = self.config.num_frames, self.config.image_size
        if frames.dim() != 5 or frames.shape[1] != t or frames.shape[2] != 3 or frames.shape[-2:] != (s, s):
            raise ProCapError(f"{what} must have shape (B, {t}, 3, {s}, {s}) (T = k + 2), got {tuple(frames.shape)}.")

    @torch.no_grad()
    def frame_features(self, frames: torch.Tensor) -> torch.Tensor:
        """Frozen VQGAN features of [0, 1] frames (B, T, 3, S, S) -> (B, T, z_channels, H, W)."""
        b, t = frames.shape[:2]
        feats = self.vqgan.features(frames.flatten(0, 1))
        return feats.view(b, t, *feats.shape[1:])

    @torch.no_grad()
    def frame_codes(self, frames: torch.Tensor) -> torch.Tensor:
        """MSM targets: VQ indices of [0, 1] frames (B, T, 3, S, S) -> (B, T*n) int64, frame-major."""
        return self.vqgan.codes(frames.flatten(0, 1)).view(frames.shape[0], -1)

    @torch.no_grad()
    def _negative_features(
        self, negatives: torch.Tensor, changed: torch.Tensor, features: torch.Tensor
    ) -> torch.Tensor:
        """Features of the consistency negatives, re-encoding only the frames a warp changed.

        The VQGAN dominates stage-1 compute and works per image, so a frame the warp left alone keeps the positive's
        features; three of the four warps change a single frame. ``changed`` (B, T) lives on the CPU (it comes
        from the warps' draws), so choosing the frames never waits on the device.
        """
        out = features.clone()
        index = changed.flatten().nonzero().flatten()
        if len(index):
            if features.is_cuda:
                index = index.pin_memory()  # an asynchronous copy needs pinned memory
            index = index.to(features.device, non_blocking=True)
            encoded = self.vqgan.features(negatives.flatten(0, 1).index_select(0, index))
            out.flatten(0, 1).index_copy_(0, index, encoded.to(out.dtype))
        return out

    def embed_frames(self, frames: torch.Tensor) -> torch.Tensor:
        """[0, 1] frames (B, T, 3, S, S) -> visual tokens (B, T*n, enc_dim) without positions."""
        return self.encoder.embed_visual(self.frame_features(frames))

    def with_difference(
        self, tokens: torch.Tensor, features: torch.Tensor, visible: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Add the per-position change embedding of the first and last frame to the frames' tokens.

        Args:
            tokens: (B, T*n, enc_dim) visual tokens, frame-major.
            features: (B, T', z, h, w) VQGAN features whose first / last frames are before / after.
            visible: optional (B, T*n) bool, the tokens stage-1 masking left visible.

        Returns:
            ``tokens`` unchanged without ``config.difference_embedding``; else ``tokens + diff`` repeated per frame, or
            with ``config.difference_visible_ends`` only on the first and last frames' tokens (the visible ones, when
            ``visible`` is given): a masked end or a procedure query gets nothing of the pair's difference.
        """
        if not self.config.difference_embedding:
            return tokens
        diff = self.encoder.embed_difference(features[:, 0], features[:, -1])  # (B, n, D)
        if not self.config.difference_visible_ends:
            return tokens + diff.repeat(1, tokens.shape[1] // diff.shape[1], 1).to(tokens.dtype)
        b, n, d = diff.shape
        frames = tokens.shape[1] // n
        ends = torch.zeros(frames, dtype=tokens.dtype, device=tokens.device)
        ends[[0, -1]] = 1.0
        weight = ends.view(1, frames, 1).expand(b, frames, n)
        if visible is not None:
            weight = weight * visible.view(b, frames, n).to(tokens.dtype)
        return tokens + (weight.unsqueeze(-1) * diff.unsqueeze(1).to(tokens.dtype)).reshape(b, frames * n, d)

    def with_change_token(
        self, tokens: torch.Tensor, features: torch.Tensor, before: torch.Tensor, after: torch.Tensor
    ) -> torch.Tensor:
        """Append the change token (:meth:`ProcedureEncoder.embed_change`) of the first and last frame.

        Args:
            tokens: (B, N, enc_dim) visual tokens.
            features: (B, T', z, h, w) VQGAN features whose first / last frames are before / after.
            before, after: (B, 3, S, S) the images of those frames (read with ``config.change_pixels``).

        Returns:
            ``tokens`` unchanged without ``config.change_token``, else (B, N + 1 + w^2, enc_dim) with a
            ``config.change_window`` of w.
        """
        if not self.config.change_token:
            return tokens
        change = self.encoder.embed_change(features[:, 0], features[:, -1], before, after)
        return torch.cat([tokens, change.to(tokens.dtype)], dim=1)

    def msm_targets(self, codes: torch.Tensor) -> torch.Tensor:
        """VQ codes (B, T*h*w), frame-major and row-major over the latent grid, in the order of the MSM head's
        outputs: (B, T*n*m^2), each token's m x m cells together (the same order as ``codes`` when m = 1)."""
        m, side = self.config.token_merge, self.config.latent_size
        if m == 1:
            return codes
        grids = codes.view(-1, 1, side, side)
        return space_to_depth(grids, m).reshape(codes.shape[0], -1)

    def positions(self) -> torch.Tensor:
        """Axial positional embeddings of the visual sequence: (T*n, enc_dim)."""
        return axial_positions(self.pos_frame, self.pos_row, self.pos_col)

    def sample_mask_params(
        self, batch: int, device: torch.device | str, generator: torch.Generator | None = None
    ) -> MaskParams:
        """Draw stage-1 masks for ``batch`` procedures with ``config.masking``."""
        grid = self.config.grid_size
        return sample_mask_params(batch, self.config.num_frames, grid, grid, self.config.masking, device, generator)

    def apply_masking(self, tokens: torch.Tensor, params: MaskParams) -> tuple[torch.Tensor, torch.Tensor]:
        """Replace masked visual tokens (B, N, D) by e_m and add axial positions (``procap.kernels.masking``).

        Returns:
            ``(tokens (B, N, D), mask (B, N) bool)``.
        """
        return kernels.masking(tokens, params, self.mask_embedding, self.pos_frame, self.pos_row, self.pos_col)

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
        if self.config.variant == "authors":
            raise ProCapError(
                "the authors variant is a stage-2 model (converted checkpoints); it has no stage-1 "
                "heads, so stage 1 cannot train it."
            )
        self._check_frames(frames)
        codes = self.frame_codes(frames) if codes is None else codes
        seq, mask = self._stage1_sequences(frames, captions, mask_params, generator)
        return self._stage1_losses(self.encoder(seq), captions, codes, mask)

    def _stage1_sequences(
        self,
        frames: torch.Tensor,
        captions: torch.Tensor,
        mask_params: MaskParams | None,
        generator: torch.Generator | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The 3B encoder inputs (positives, align negatives, csy negatives) and the positives' (B, N) mask."""
        b = frames.shape[0]
        negatives, _, changed = consistency_negatives(
            frames, self.config.negative_probs, _on(generator, "cpu"), return_changed=True
        )
        if mask_params is None:
            mask_params = self.sample_mask_params(b, frames.device, _on(generator, frames.device))
        features = self.frame_features(frames)
        features = torch.cat([features, self._negative_features(negatives, changed, features)])
        visual = self.encoder.embed_visual(features)  # (2B, N, D): positives, then consistency negatives
        visual, mask = self.apply_masking(visual, _repeat(mask_params, 2))  # the same mask for both halves
        frames_both = torch.cat([frames, negatives.to(frames.dtype)])  # the change token of each half its own ends
        visual = self.with_difference(visual, features, visible=~mask)
        visual = self.with_change_token(visual, features, frames_both[:, 0], frames_both[:, -1])
        text = self.encoder.embed_caption(captions)
        seq = self.encoder.stage1_sequence(
            torch.cat([text, text.roll(1, dims=0), text]), torch.cat([visual[:b], visual[:b], visual[b:]])
        )
        return seq, mask[:b]

    def _stage1_losses(
        self, out: torch.Tensor, captions: torch.Tensor, codes: torch.Tensor, mask: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        """Heads and losses on the encoder output (3B, 2 + L + N, D); see the module docstring's table."""
        b, length = captions.shape
        enc = self.encoder
        # MSM head on every position, weighted by the mask: a boolean gather would wait on the device for its size.
        visual = out[:b, length + 2 : length + 2 + mask.shape[1]]  # a change token, if any, comes after
        logits = enc.msm_head(visual)
        cells = self.config.token_merge**2  # one code per merged latent cell
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
    def procedure_tokens(self, before: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
        """Stage-2 input ``{e_bef, e_m x k*n, e_aft}`` + axial positions: (B, 3, S, S) x 2 -> (B, T*n, enc_dim),
        (B, ``config.memory_tokens``, enc_dim) with the change tokens last (``config.change_token``)."""
        features = self.frame_features(torch.stack([before, after], dim=1))  # (B, 2, z, h, w)
        visual = self.encoder.embed_visual(features)  # (B, 2n, D)
        b, n2, d = visual.shape
        n = n2 // 2
        queries = self.mask_embedding.view(1, 1, d).expand(b, self.config.num_keyframes * n, d)
        seq = torch.cat([visual[:, :n], queries.to(visual.dtype), visual[:, n:]], dim=1)
        seq = self.with_difference(seq + self.positions().to(seq.dtype), features)
        return self.with_change_token(seq, features, before, after)

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
            features = self.frame_features(frames)
            tokens = self.with_difference(self.encoder.embed_visual(features) + self.positions(), features)
            tokens = self.with_change_token(tokens, features, frames[:, 0], frames[:, -1])
        else:
            s = self.config.image_size
            for name, image in (("before", before), ("after", after)):
                if image.dim() != 4 or image.shape[1:] != (3, s, s):
                    raise ProCapError(f"{name} images must have shape (B, 3, {s}, {s}), got {tuple(image.shape)}.")
            tokens = self.procedure_tokens(before, after)
        if self.config.variant == "authors":
            seq, mask = self.encoder.with_prefix(tokens)
            return self.memory_mlp(self.encoder(seq, mask)[:, self.config.enc_prefix_tokens :])
        encoded = self.encoder(tokens)
        if self.config.change_broadcast:
            # departure (docs/model.md): every memory token carries the change token, so the decoder reads it
            # without first learning to find one slot among hundreds
            first = self.memory_parts()["change"].start
            encoded = encoded + encoded[:, first : first + 1]
        return self.memory_mlp(encoded)

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

    def memory_parts(self) -> dict[str, slice]:
        """Where each part of the decoder memory sits: ``before``, ``queries`` (k*n), ``after``, ``change`` (the
        pooled change token) and ``window`` (its window's cells); the last two are empty slices when the config has
        none. The ``authors`` variant's memory follows the same layout."""
        n, k = self.config.tokens_per_frame, self.config.num_keyframes
        frames = self.config.num_frames * n
        pooled = frames + int(self.config.change_token)
        return {
            "before": slice(0, n),
            "queries": slice(n, (k + 1) * n),
            "after": slice((k + 1) * n, frames),
            "change": slice(frames, pooled),
            "window": slice(pooled, self.config.memory_tokens),
        }

    def without_parts(self, memory: torch.Tensor, parts: tuple[str, ...]) -> torch.Tensor:
        """``memory`` (B, N, dec_dim) with the named :meth:`memory_parts` removed: an inference-time ablation (the
        decoder never sees them; the encoder still ran over the whole sequence)."""
        layout = self.memory_parts()
        unknown = set(parts) - set(layout)
        if unknown:
            raise ProCapError(f"unknown memory part {min(unknown)!r}; choose from {', '.join(layout)}.")
        keep = [i for name, span in layout.items() if name not in parts for i in range(span.start, span.stop)]
        if not keep:
            raise ProCapError("the ablation removes the whole memory.")
        return memory[:, keep]

    @torch.no_grad()
    def generate_from_memory(
        self,
        memory: torch.Tensor,
        max_len: int | None = None,
        num_beams: int = 1,
        length_penalty: float = 1.0,
        strategy: DecodingStrategy | None = None,
    ) -> torch.Tensor:
        """Captions from a decoder memory (B, N, dec_dim) -> (B, max_len - 1); see :meth:`generate`."""
        self.check_can_caption()
        max_len = self.config.max_caption_len if max_len is None else validate.integer(max_len, "max_len")
        if not 2 <= max_len <= self.config.max_caption_len:
            raise ProCapError(f"max_len must be in [2, {self.config.max_caption_len}], got {max_len}.")
        strategy = strategy or decoding_strategy(num_beams, length_penalty)
        was_training = self.training
        self.eval()
        try:
            return strategy.oracle(self.decoder, memory, max_len)
        finally:
            self.train(was_training)

    @torch.no_grad()
    def generate(
        self,
        before: torch.Tensor,
        after: torch.Tensor,
        max_len: int | None = None,
        frames: torch.Tensor | None = None,
        num_beams: int = 1,
        length_penalty: float = 1.0,
        strategy: DecodingStrategy | None = None,
    ) -> torch.Tensor:
        """Greedy or beam-search captions (the oracle for ``procap.fast``): eager, full prefix recomputed every step.

        Args:
            before, after: (B, 3, S, S) in [0, 1].
            max_len: caption length including BOS (default ``config.max_caption_len``).
            frames: optional explicit procedure frames (B, T, 3, S, S).
            num_beams: 1 decodes greedily; more runs :func:`procap.model.beam.beam_search` with that many beams.
            length_penalty: beam search ranks finished captions by log-probability / length ** length_penalty.
            strategy: a :mod:`procap.model.decoding` strategy instead of the two arguments above.

        Returns:
            (B, max_len - 1) int64 tokens after BOS, EOS included, PAD after EOS, [UNK] and other specials
            never produced. Runs in eval mode (dropout off) and restores the previous mode. The ``authors``
            variant follows their rule instead: every step decoded (tokens after EOS kept), only [UNK] suppressed;
            with beams both variants stop each caption at EOS.
        """
        self.check_can_caption()  # refused before the images are encoded, as are the arguments below
        strategy = strategy or decoding_strategy(num_beams, length_penalty)
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
    """Init std of the encoder side and of the decoder: 0.02 (BERT), or with ``config.width_scaled_init``
    0.02 * sqrt(paper width / width), which is 0.02 at the paper's widths (768 / 512) and keeps a narrow model's
    attention logits from starting flat (the ``tiny`` preset: 0.049 / 0.040)."""
    if not config.width_scaled_init:
        return 0.02, 0.02
    return 0.02 * math.sqrt(768 / config.enc_dim), 0.02 * math.sqrt(512 / config.dec_dim)


def count_parameters(model: ProCap) -> dict[str, int]:
    """Parameter counts: ``vqgan``, ``encoder`` (stack, input embeddings, heads, e_m, positions), ``decoder``
    (with the memory MLP), ``total``. Works on a model built on the meta device."""
    vqgan = sum(p.numel() for p in model.vqgan.parameters())
    decoder = sum(p.numel() for m in (model.decoder, model.memory_mlp) for p in m.parameters())
    total = sum(p.numel() for p in model.parameters())
    return {"vqgan": vqgan, "encoder": total - vqgan - decoder, "decoder": decoder, "total": total}


def _repeat(params: MaskParams, times: int) -> MaskParams:
    """The same masks for ``times`` consecutive copies of the batch."""
    return MaskParams(
        *(torch.cat([t] * times) for t in (params.scheme, params.patch_prob, params.uniform, params.block))
    )


def _on(generator: torch.Generator | None, device: torch.device | str) -> torch.Generator | None:
    """``generator`` if it lives on ``device``, else None (draws there use the global RNG)."""
    if generator is None or not same_device(device, generator.device):
        return None
    return generator
