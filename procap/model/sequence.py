"""Every sequence the procedure encoder reads, and the layout of the decoder memory it becomes.

:class:`SequenceAssembly` is the one owner of sequence assembly, a base class of :class:`procap.model.procap.ProCap`
(its parameters stay the model's: ``mask_embedding``, ``pos_frame``, ``pos_row``, ``pos_col``, and the encoder's
embeddings, so checkpoints keep their keys):

- stage 1: VQGAN features -> visual tokens -> masking with e_m and axial positions -> the departures' difference
  embedding and change tokens -> ``[e_align, e_T, e_csy, e_I]`` (:meth:`SequenceAssembly.stage1_sequence`, for
  the 3B rows of a stage-1 batch ``_stage1_sequences``);
- stage 2: ``{e_bef, e_m x k*n, e_aft}`` + positions, or the positions over explicit frames, then the same
  departures (:meth:`SequenceAssembly.procedure_tokens`, :meth:`SequenceAssembly.frame_tokens`), run through the
  encoder with the ``authors`` prefix and the change broadcast where the config has them
  (:meth:`SequenceAssembly.encode_memory`);
- the memory's parts (:meth:`SequenceAssembly.memory_parts`).

The model reads ``config.departures`` through :attr:`SequenceAssembly.departures`, and its forward only here (the
stage-1 loss asks it for ``token_merge``, the MSM head's cells per token);
:class:`procap.model.encoder.ProcedureEncoder` reads them once, when it builds the embeddings they need, and
:func:`procap.model.procap.init_stds` for the initialisation.
"""

from __future__ import annotations

import torch
from torch import nn

from procap import kernels
from procap.core.config import Departures, ProCapConfig
from procap.core.errors import ProCapError
from procap.core.validate import same_device
from procap.kernels.masking import MaskParams, axial_positions, mask_from_params
from procap.model.departures import space_to_depth
from procap.model.encoder import ProcedureEncoder, authors_prefix_mask
from procap.model.masking import sample_mask_params
from procap.model.negatives import consistency_negatives
from procap.model.vqgan import VQGAN


class SequenceAssembly(nn.Module):
    """The encoder's input sequences and the memory layout of a model holding the attributes below.

    Attributes (set by the model):
        config: the architecture; vqgan: the frozen tokenizer; encoder: the :class:`ProcedureEncoder`.
        mask_embedding: (enc_dim,) e_m, also the procedure query of stage 2.
        pos_frame, pos_row, pos_col: (T, enc_dim), (H, enc_dim), (W, enc_dim) axial positions.
    """

    config: ProCapConfig
    vqgan: VQGAN
    encoder: ProcedureEncoder
    mask_embedding: nn.Parameter
    pos_frame: nn.Parameter
    pos_row: nn.Parameter
    pos_col: nn.Parameter

    @property
    def departures(self) -> Departures:
        """The departures from the paper this model was built with (all off in the paper presets)."""
        return self.config.departures

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
        return self.encoder.embed_visual(self.frame_features(frames), self.encoder.image_features(frames))

    def with_difference(
        self,
        tokens: torch.Tensor,
        features: torch.Tensor,
        visible: torch.Tensor | None = None,
        learned: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Add the per-position change embedding of the first and last frame to the frames' tokens.

        Args:
            tokens: (B, T*n, enc_dim) visual tokens, frame-major.
            features: (B, T', z, h, w) VQGAN features whose first / last frames are before / after.
            visible: optional (B, T*n) bool, the tokens stage-1 masking left visible.
            learned: (B, T', c, h, w) image features of the same frames (``departures.image_encoder``).

        Returns:
            ``tokens`` unchanged without ``departures.difference_embedding``; else ``tokens + diff`` repeated per frame, or
            with ``departures.difference_visible_ends`` only on the first and last frames' tokens, and with ``visible``
            only at the positions where both ends are visible: the difference of a position holds both ends, so
            a masked end, or a procedure query, gets nothing of it, and neither does the other end's token there.
        """
        if not self.departures.difference_embedding:
            return tokens
        diff = self.encoder.embed_difference(features[:, 0], features[:, -1], *_learned_ends(learned))  # (B, n, D)
        if not self.departures.difference_visible_ends:
            return tokens + diff.repeat(1, tokens.shape[1] // diff.shape[1], 1).to(tokens.dtype)
        b, n, d = diff.shape
        frames = tokens.shape[1] // n
        # Compared on the device: a Python list index would copy from the host, which a CUDA graph capture refuses.
        position = torch.arange(frames, device=tokens.device)
        at_ends = ((position == 0) | (position == frames - 1)).to(tokens.dtype)
        weight = at_ends.view(1, frames, 1).expand(b, frames, n)
        if visible is not None:
            both = visible.view(b, frames, n)
            weight = weight * (both[:, :1] & both[:, -1:]).to(tokens.dtype)
        return tokens + (weight.unsqueeze(-1) * diff.unsqueeze(1).to(tokens.dtype)).reshape(b, frames * n, d)

    def with_change_token(
        self,
        tokens: torch.Tensor,
        features: torch.Tensor,
        before: torch.Tensor,
        after: torch.Tensor,
        learned: torch.Tensor | None = None,
        visible: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Append the change token (:meth:`ProcedureEncoder.embed_change`) of the first and last frame.

        Args:
            tokens: (B, N, enc_dim) visual tokens.
            features: (B, T', z, h, w) VQGAN features whose first / last frames are before / after.
            before, after: (B, 3, S, S) the images of those frames (read with ``departures.change_pixels``).
            learned: (B, T', c, h, w) image features of the same frames (``departures.image_encoder``).
            visible: optional (B, T'*n) bool, the tokens stage-1 masking left visible: the change tokens read only
                the cells whose token is visible in both ends (a masked end is not handed over through them).

        Returns:
            ``tokens`` unchanged without ``departures.change_token``, else (B, N + 1 + w^2, enc_dim) with a
            ``departures.change_window`` of w.
        """
        if not self.departures.change_token:
            return tokens
        hidden = None
        if visible is not None:
            grid, merge = self.config.grid_size, self.departures.token_merge
            shown = visible.view(visible.shape[0], -1, grid, grid)
            both = shown[:, 0] & shown[:, -1]  # (B, g, g) tokens -> (B, h, w) latent cells
            hidden = ~both.repeat_interleave(merge, 1).repeat_interleave(merge, 2)
        learned_before, learned_after = _learned_ends(learned)
        change = self.encoder.embed_change(
            features[:, 0], features[:, -1], before, after, learned_before, learned_after, hidden=hidden
        )
        return torch.cat([tokens, change.to(tokens.dtype)], dim=1)

    def hidden_pixels(self, frames: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Frames (B, T, 3, S, S) with the pixels under every masked token (``mask`` (B, T*n) bool) set to 0: what
        stage 1's image encoder reads, so that no learned feature of a visible token sees into a masked one."""
        b, t, _, size, _ = frames.shape
        grid = self.config.grid_size
        shown = (~mask).view(b, t, grid, grid).to(frames.dtype)
        scale = size // grid
        return frames * shown.repeat_interleave(scale, 2).repeat_interleave(scale, 3).unsqueeze(2)

    def msm_targets(self, codes: torch.Tensor) -> torch.Tensor:
        """VQ codes (B, T*h*w), frame-major and row-major over the latent grid, in the order of the MSM head's
        outputs: (B, T*n*m^2), each token's m x m cells together (the same order as ``codes`` when m = 1)."""
        m, side = self.departures.token_merge, self.config.latent_size
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

    # -- stage 1 ---------------------------------------------------------------------------------------------------
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
        frames_both = torch.cat([frames, negatives.to(frames.dtype)])  # the change token of each half its own ends
        learned = None
        if self.encoder.image_encoder is not None:
            grid = self.config.grid_size
            hidden = mask_from_params(_repeat(mask_params, 2), self.config.num_frames, grid, grid)
            learned = self.encoder.image_features(self.hidden_pixels(frames_both, hidden))
        visual = self.encoder.embed_visual(features, learned)  # (2B, N, D): positives, then consistency negatives
        visual, mask = self.apply_masking(visual, _repeat(mask_params, 2))  # the same mask for both halves
        visual = self.with_difference(visual, features, visible=~mask, learned=learned)
        visual = self.with_change_token(visual, features, frames_both[:, 0], frames_both[:, -1], learned, visible=~mask)
        text = self.encoder.embed_caption(captions)
        seq = self.stage1_sequence(
            torch.cat([text, text.roll(1, dims=0), text]), torch.cat([visual[:b], visual[:b], visual[b:]])
        )
        return seq, mask[:b]

    def stage1_sequence(self, caption_tokens: torch.Tensor, visual_tokens: torch.Tensor) -> torch.Tensor:
        """``[e_align, e_T, e_csy, e_I]``: (B, L, D) and (B, N, D) -> (B, L + 2 + N, D).

        The align output is read at position 0, the csy output at ``L + 1``, the visual outputs from ``L + 2``.
        """
        b, d = caption_tokens.shape[0], caption_tokens.shape[2]
        align = self.encoder.align_token.view(1, 1, d).expand(b, 1, d)
        csy = self.encoder.csy_token.view(1, 1, d).expand(b, 1, d)
        return torch.cat([align, caption_tokens, csy, visual_tokens], dim=1)

    # -- stage 2 ---------------------------------------------------------------------------------------------------
    def procedure_tokens(self, before: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
        """Stage-2 input ``{e_bef, e_m x k*n, e_aft}`` + axial positions: (B, 3, S, S) x 2 -> (B, T*n, enc_dim),
        (B, ``config.memory_tokens``, enc_dim) with the change tokens last (``departures.change_token``)."""
        images = torch.stack([before, after], dim=1)
        features = self.frame_features(images)  # (B, 2, z, h, w)
        learned = self.encoder.image_features(images)
        visual = self.encoder.embed_visual(features, learned)  # (B, 2n, D)
        b, n2, d = visual.shape
        n = n2 // 2
        queries = self.mask_embedding.view(1, 1, d).expand(b, self.config.num_keyframes * n, d)
        seq = torch.cat([visual[:, :n], queries.to(visual.dtype), visual[:, n:]], dim=1)
        seq = self.with_difference(seq + self.positions().to(seq.dtype), features, learned=learned)
        return self.with_change_token(seq, features, before, after, learned)

    def frame_tokens(self, frames: torch.Tensor) -> torch.Tensor:
        """Explicit procedure frames (B, T, 3, S, S) -> their tokens + axial positions, with the departures' difference
        embedding and change tokens: (B, ``config.memory_tokens``, enc_dim)."""
        features = self.frame_features(frames)
        learned = self.encoder.image_features(frames)
        tokens = self.encoder.embed_visual(features, learned) + self.positions()
        tokens = self.with_difference(tokens, features, learned=learned)
        return self.with_change_token(tokens, features, frames[:, 0], frames[:, -1], learned)

    def with_prefix(self, visual_tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``authors`` variant: ``[prefix, visual]`` (B, P + N, D) and its (P + N, P + N) attention mask."""
        b, _, d = visual_tokens.shape
        prefix = self.encoder.prefix.to(visual_tokens.dtype).view(1, -1, d).expand(b, -1, d)
        seq = torch.cat([prefix, visual_tokens], dim=1)
        return seq, authors_prefix_mask(self.encoder.prefix.shape[0], seq.shape[1], seq.device)

    def encode_memory(self, tokens: torch.Tensor) -> torch.Tensor:
        """Encoder outputs (B, ``config.memory_tokens``, enc_dim) of stage-2 tokens: behind the ``authors`` variant's
        prefix (dropped from the output), and with the change token added to every output under
        ``departures.change_broadcast``."""
        if self.config.authors.enabled:
            seq, mask = self.with_prefix(tokens)
            return self.encoder(seq, mask)[:, self.config.authors.prefix_tokens :]
        encoded = self.encoder(tokens)
        if self.departures.change_broadcast:
            # departure (docs/model.md): every memory token carries the change token, so the decoder reads it
            # without first learning to find one slot among hundreds
            first = self.memory_parts()["change"].start
            encoded = encoded + encoded[:, first : first + 1]
        return encoded

    # -- memory layout ---------------------------------------------------------------------------------------------
    def memory_parts(self) -> dict[str, slice]:
        """Where each part of the decoder memory sits: ``before``, ``queries`` (k*n), ``after``, ``change`` (the
        pooled change token) and ``window`` (its window's cells); the last two are empty slices when the config has
        none. The ``authors`` variant's memory follows the same layout."""
        n, k = self.config.tokens_per_frame, self.config.num_keyframes
        frames = self.config.num_frames * n
        pooled = frames + int(self.departures.change_token)
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


def _learned_ends(learned: torch.Tensor | None) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The learned image features (B, T, c, h, w) of the first and last frames, or two Nones without them."""
    return (None, None) if learned is None else (learned[:, 0], learned[:, -1])
