"""The VQGAN tokenizer (taming-transformers ``VQModel`` layout): frozen visual features and MSM targets for ProCap.

State-dict keys equal taming's (``encoder.*``, ``quant_conv.*``, ``quantize.embedding.weight``,
``post_quant_conv.*``, ``decoder.*``), so :meth:`VQGAN.from_taming_checkpoint` loads a taming ``.ckpt``
with strict key and shape checks.

Where attention sits. taming decides per level by comparing the level's *nominal* resolution, computed from the
config's ``resolution`` field (not from the input), with ``attn_resolutions``. For the f16 config with
``resolution: 224`` and ``attn_resolutions: [16]`` the nominal resolutions are 224, 112, 56, 28, 14: none is 16,
so the levels carry no attention and the only attention block is ``mid.attn_1``, which runs at 14x14. That is
what a checkpoint trained with that config (the authors' ``vqgan.1024.224.config.yml`` fine-tune) contains, and
what we build from ``VQGANConfig()``. taming's ImageNet f16 checkpoints were trained with ``resolution: 256``:
their level 4 (16x16 nominal, 14x14 on a 224 input) has attention; load them with ``VQGANConfig(resolution=256)``.

Image ranges, following the authors: :meth:`VQGAN.features` encodes [0, 1] images as they are, while
:meth:`VQGAN.codes`, :meth:`VQGAN.encode` and :meth:`VQGAN.forward` map [0, 1] to [-1, 1] (taming's range)
first; :meth:`VQGAN.decode` maps back to the [0, 1] scale (not clamped).
"""

from __future__ import annotations

import pickle
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from procap import kernels
from procap.core.config import VQGANConfig, config_from_dict
from procap.core.errors import ProCapError
from procap.core.json_files import parse_json
from procap.core.validate import input_file
from procap.core.weights import (
    check_dtypes,
    check_file_fits,
    check_zip_expansion,
    load_module_state,
    load_weights,
    read_header,
    save_module,
)
from procap.model.fused_form import FusedForm
from procap.model.layers import ModuleStack
from procap.model.vqgan_blocks import Downsample, Level, MidBlock, Upsample, group_norm, norm_act
from procap.model.vqgan_fused import FusedVQGANEncoder
from procap.model.vqgan_memo import FeatureMemo

VQGAN_FORMAT = "procap-vqgan"  # the "format" metadata of files written by VQGAN.save


def attention_levels(config: VQGANConfig) -> list[bool]:
    """Which levels carry attention, by taming's rule (nominal resolution ``config.resolution // 2**i``)."""
    return [config.resolution // 2**i in config.attn_resolutions for i in range(len(config.ch_mult))]


class Encoder(nn.Module):
    """Image (B, 3, S, S) -> latent (B, z_channels, S/f, S/f) with f = 2**(len(ch_mult) - 1)."""

    def __init__(self, config: VQGANConfig) -> None:
        super().__init__()
        ch, mult, n_res = config.ch, config.ch_mult, config.num_res_blocks
        self.conv_in = nn.Conv2d(config.in_channels, ch, kernel_size=3, stride=1, padding=1)
        widths_in = (1, *mult)
        self.down: ModuleStack[Level] = ModuleStack()
        for i, with_attn in enumerate(attention_levels(config)):
            c_in, c_out = ch * widths_in[i], ch * mult[i]
            level = Level([(c_in, c_out)] + [(c_out, c_out)] * (n_res - 1), with_attn, config.dropout)
            if i != len(mult) - 1:
                level.downsample = Downsample(c_out)
            self.down.append(level)
        top = ch * mult[-1]
        self.mid = MidBlock(top, config.dropout)
        self.norm_out = group_norm(top)
        self.conv_out = nn.Conv2d(top, config.z_channels, kernel_size=3, stride=1, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv_in(x)
        for level in self.down:
            h = level(h)
        h = self.mid(h)
        return self.conv_out(norm_act(self.norm_out, h))


class Decoder(nn.Module):
    """Latent (B, z_channels, h, w) -> image (B, out_ch, f*h, f*w) in taming's [-1, 1] scale (not clamped)."""

    def __init__(self, config: VQGANConfig) -> None:
        super().__init__()
        ch, mult, n_res = config.ch, config.ch_mult, config.num_res_blocks
        top = ch * mult[-1]
        self.conv_in = nn.Conv2d(config.z_channels, top, kernel_size=3, stride=1, padding=1)
        self.mid = MidBlock(top, config.dropout)
        attn = attention_levels(config)
        levels: list[Level] = []
        c_in = top
        for i in reversed(range(len(mult))):  # built top-down, stored bottom-up like taming's ``up.insert(0, ...)``
            c_out = ch * mult[i]
            level = Level([(c_in, c_out)] + [(c_out, c_out)] * n_res, attn[i], config.dropout)
            if i != 0:
                level.upsample = Upsample(c_out)
            levels.insert(0, level)
            c_in = c_out
        self.up = ModuleStack(levels)
        self.norm_out = group_norm(c_in)
        self.conv_out = nn.Conv2d(c_in, config.out_ch, kernel_size=3, stride=1, padding=1)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        h = self.mid(self.conv_in(z))
        for level in reversed(self.up):
            h = level(h)
        return self.conv_out(norm_act(self.norm_out, h))


class VectorQuantizer(nn.Module):
    """Nearest-code quantizer with a straight-through estimator; the codebook is ``embedding.weight`` (K, D)."""

    def __init__(self, n_embed: int, embed_dim: int, beta: float) -> None:
        super().__init__()
        self.beta = beta
        self.embedding = nn.Embedding(n_embed, embed_dim)
        nn.init.uniform_(self.embedding.weight, -1.0 / n_embed, 1.0 / n_embed)

    def forward(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Quantize a latent map.

        Args:
            z: (B, D, h, w) latents.

        Returns:
            ``(z_q, loss, indices)``: (B, D, h, w) straight-through quantized latents, the scalar VQ loss
            ``||sg[z] - e||^2 + beta ||z - sg[e]||^2`` (codebook + commitment, means over elements), and
            (B, h*w) int64 code indices in row-major (h, w) order.
        """
        b, d, h, w = z.shape
        flat = z.permute(0, 2, 3, 1).reshape(-1, d)  # (B*h*w, D), row-major positions
        indices = kernels.vq_nearest(flat, self.embedding.weight)
        z_q = self.embedding(indices).view(b, h, w, d).permute(0, 3, 1, 2)
        codebook_loss = F.mse_loss(z_q, z.detach())
        commitment_loss = F.mse_loss(z, z_q.detach())
        loss = codebook_loss + self.beta * commitment_loss
        z_q = z + (z_q - z).detach()  # straight-through: the decoder's gradient reaches the encoder unchanged
        return z_q, loss, indices.view(b, h * w)


class VQGAN(FusedForm, nn.Module):
    """taming-transformers ``VQModel`` without the GAN loss: encoder, quant_conv, quantize, post_quant_conv, decoder.

    Its encoder has a fused inference form (:meth:`use_fused`, :mod:`procap.model.fused_form`), chosen by
    ``procap.fast.Captioner``; a VQGAN is built with the readable one.

    Args:
        config: architecture hyper-parameters; ``VQGANConfig()`` is the f16, 1024-code model of the paper.
    """

    fused_options = ("channels_last", "downsample_4x4", "input_channels", "group_norm", "conv_in_stats")

    def __init__(self, config: VQGANConfig | None = None) -> None:
        super().__init__()
        self.config = config or VQGANConfig()
        c = self.config
        self.encoder: Encoder | FusedVQGANEncoder = Encoder(c)  # the readable form until use_fused
        self.decoder = Decoder(c)
        self.quantize = VectorQuantizer(c.n_embed, c.embed_dim, c.beta)
        self.quant_conv = nn.Conv2d(c.z_channels, c.embed_dim, kernel_size=1)
        self.post_quant_conv = nn.Conv2d(c.embed_dim, c.z_channels, kernel_size=1)
        self.memo: FeatureMemo | None = None  # per-image results of the frozen tokenizer: memoize()

    # -- the encoder's form -----------------------------------------------------------------------------------------
    @property
    def reference_encoder(self) -> Encoder:
        """The readable :class:`Encoder`, whichever form :attr:`encoder` runs."""
        return self.encoder.reference if isinstance(self.encoder, FusedVQGANEncoder) else self.encoder

    def use_fused(self, enabled: bool = True, **options: Any) -> None:
        """Run the encoder in its fused inference form (:class:`~procap.model.vqgan_fused.FusedVQGANEncoder`), or
        with ``enabled=False`` in its readable form again.

        The fused form shares the encoder's modules (state-dict keys unchanged) and holds a few buffers derived from
        the weights of this moment (the padded ``conv_in``, 4x4 downsample kernels, merged q/k/v): choose it after
        the weights are moved and final, and switch back before changing them. Eval mode only. Choosing it again
        builds it afresh from the readable encoder.

        Args:
            enabled: the fused form (True) or the readable :class:`Encoder` (False).
            options: :class:`~procap.model.vqgan_fused.FusedVQGANEncoder`'s keyword arguments (``channels_last``,
                ``downsample_4x4``, ``input_channels``, ``group_norm``, ``conv_in_stats``).
        """
        super().use_fused(enabled, **options)

    def _choose_fused(self, enabled: bool, **options: Any) -> None:
        reference = self.reference_encoder
        self.encoder = FusedVQGANEncoder(reference, **options) if enabled else reference

    # -- the memo of a frozen tokenizer ---------------------------------------------------------------------------
    def memoize(self, max_items: int = 200_000) -> FeatureMemo:
        """Remember ``features`` / ``codes`` per image from now on (:mod:`procap.model.vqgan_memo`); returns the memo.

        For a frozen tokenizer on a small dataset: only :meth:`remember` stores, every call looks up.
        """
        if self.memo is None:
            self.memo = FeatureMemo(max_items)
        return self.memo

    @torch.no_grad()
    def remember(self, images: torch.Tensor, codes: bool = True) -> None:
        """Store the features (and codes) of clean images (B, 3, S, S) in the memo (:meth:`memoize` first)."""
        if self.memo is None:
            raise RuntimeError("the VQGAN keeps no memo: call memoize() first")
        self.memo.lookup("features", images, self._features, store=True)
        if codes:
            self.memo.lookup("codes", images, self._codes, store=True)

    # -- ProCap's two uses ------------------------------------------------------------------------------------
    def features(self, images: torch.Tensor) -> torch.Tensor:
        """Visual features for the procedure encoder: the encoder output before ``quant_conv``.

        Args:
            images: (B, 3, S, S) in [0, 1], fed as they are (the authors do not rescale here).

        Returns:
            (B, z_channels, S/f, S/f).
        """
        return self._features(images) if self.memo is None else self.memo.lookup("features", images, self._features)

    def _features(self, images: torch.Tensor) -> torch.Tensor:
        return self.encoder(images)

    def codes(self, images: torch.Tensor) -> torch.Tensor:
        """MSM targets: codebook indices of the quantized latent of ``2 * images - 1``.

        Args:
            images: (B, 3, S, S) in [0, 1].

        Returns:
            (B, h*w) int64 indices, row-major (h, w).
        """
        return self._codes(images) if self.memo is None else self.memo.lookup("codes", images, self._codes)

    def _codes(self, images: torch.Tensor) -> torch.Tensor:
        z = self.latents(images)
        b, d, h, w = z.shape
        indices = kernels.vq_nearest(z.permute(0, 2, 3, 1).reshape(-1, d), self.quantize.embedding.weight)
        return indices.view(b, h * w)

    # -- autoencoder ------------------------------------------------------------------------------------------
    def latents(self, images: torch.Tensor) -> torch.Tensor:
        """[0, 1] images (B, 3, S, S) -> latents before quantization (B, embed_dim, h, w): taming's range
        ``2 * images - 1`` through the encoder and ``quant_conv``."""
        return self.quant_conv(self.encoder(2.0 * images - 1.0))

    def encode(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """[0, 1] images (B, 3, S, S) -> ``(quant (B, embed_dim, h, w), vq_loss, indices (B, h*w))``."""
        return self.quantize(self.latents(images))

    def decode(self, quant: torch.Tensor) -> torch.Tensor:
        """Quantized latents (B, embed_dim, h, w) -> images (B, 3, S, S) on the [0, 1] scale (not clamped)."""
        return (self.decoder(self.post_quant_conv(quant)) + 1.0) / 2.0

    def decode_codes(self, indices: torch.Tensor, height: int, width: int) -> torch.Tensor:
        """Code indices (B, h*w) -> images (B, 3, S, S) on the [0, 1] scale."""
        z_q = self.quantize.embedding(indices).view(indices.shape[0], height, width, -1).permute(0, 3, 1, 2)
        return self.decode(z_q)

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Reconstruct [0, 1] images: returns ``(reconstruction (B, 3, S, S) on the [0, 1] scale, vq_loss)``."""
        quant, vq_loss, _ = self.encode(images)
        return self.decode(quant), vq_loss

    def reconstruction_loss(
        self,
        images: torch.Tensor,
        before_quantize: Callable[[torch.Tensor], None] | None = None,
        after_quantize: Callable[[torch.Tensor], None] | None = None,
    ) -> dict[str, torch.Tensor]:
        """Training objective without the GAN term: L1 (in taming's [-1, 1] scale) + codebook + commitment.

        Args:
            images: (B, 3, S, S) in [0, 1].
            before_quantize: called with the batch's latents as (B*h*w, embed_dim) rows before they are quantized
                (the codebook upkeep of ``procap vqgan`` initialises and restarts codes from them).
            after_quantize: called with the (B, h*w) code indices the batch used.

        Returns:
            ``{"loss", "l1", "vq"}`` scalars; ``loss = l1 + vq``.
        """
        z = self.latents(images)
        if before_quantize is not None:
            before_quantize(z.permute(0, 2, 3, 1).reshape(-1, z.shape[1]))
        quant, vq_loss, indices = self.quantize(z)
        if after_quantize is not None:
            after_quantize(indices)
        recon = self.decode(quant)
        l1 = (2.0 * (recon - images)).abs().mean()  # x2: the same value as L1 between [-1, 1] images
        return {"loss": l1 + vq_loss, "l1": l1, "vq": vq_loss}

    # -- saving and loading ------------------------------------------------------------------------------------
    def save(self, path: str | Path, extra: dict | None = None) -> Path:
        """Weights in safetensors with this :class:`VQGANConfig` (and ``extra``) in the metadata; no pickle."""
        import dataclasses

        meta = {"format": VQGAN_FORMAT, "vqgan_config": dataclasses.asdict(self.config), "extra": extra or {}}
        return save_module(path, self, meta)

    @classmethod
    def load(cls, path: str | Path) -> VQGAN:
        """A VQGAN from :meth:`save` output (``.safetensors``) or a taming-transformers ``.ckpt``, in eval mode.

        Raises:
            ProCapError: the file is missing, is neither format, or does not fit the architecture.
        """
        input_file(path, "VQGAN checkpoint")
        if not str(path).endswith(".safetensors"):
            return cls.from_taming_checkpoint(path).eval()
        model = cls(cls.read_config(path))
        state, _ = cls.read_saved(path)
        load_weights(model, state, path)
        return model.eval()

    @classmethod
    def read_config(cls, path: str | Path) -> VQGANConfig:
        """The :class:`VQGANConfig` of a :meth:`save` file, checked, without reading its weights.

        The configuration is checked against sane bounds (``procap.core.config.check_config``) and the stored tensor
        shapes against a model built on the meta device, so a crafted file fails before anything is allocated.

        Raises:
            ProCapError: not a :meth:`save` file, malformed or out-of-bounds configuration, or tensors that do
                not fit it.
        """
        _, raw = read_header(path, "VQGAN weights")
        source = f"the metadata of VQGAN weights file {path}"
        fmt = parse_json(raw.get("format", "null"), source)
        config = parse_json(raw.get("vqgan_config", "null"), source)
        if fmt != VQGAN_FORMAT:
            raise ProCapError(f"{path} is not a VQGAN file written by `procap vqgan`")
        try:
            config = config_from_dict(VQGANConfig, config)
        except ValueError as exc:
            raise ProCapError(f"VQGAN weights file {path} holds an invalid configuration ({exc})") from None
        check_file_fits(path, lambda: cls(config), "VQGAN weights")
        return config

    @staticmethod
    def read_saved(path: str | Path) -> tuple[dict[str, torch.Tensor], dict]:
        """``(state_dict, metadata)`` of a file written by :meth:`save`, checked to be one."""
        state, meta = load_module_state(path, "VQGAN weights")
        if meta.get("format") != VQGAN_FORMAT:
            raise ProCapError(f"{path} is not a VQGAN file written by `procap vqgan`")
        return state, meta

    @classmethod
    def from_taming_checkpoint(cls, path: str | Path, config: VQGANConfig | None = None) -> VQGAN:
        """Load a taming-transformers checkpoint (``torch.load(path)["state_dict"]``) with strict checks.

        Loading uses ``weights_only=True`` (no pickled code runs). Keys under ``loss.`` (discriminator, LPIPS)
        are ignored; every other key must exist in the model with the same shape, and every model key must
        be present, otherwise a :class:`ProCapError` lists the first offending keys.

        Args:
            path: the ``.ckpt`` file.
            config: the architecture the checkpoint was trained with (default ``VQGANConfig()``).
        """
        model = cls(config)
        state = load_taming_state_dict(path)
        check_state_dict(model, state, path)
        check_dtypes(model.state_dict(), state, path)
        model.load_state_dict(state, strict=True)
        return model


def load_taming_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """Read the VQGAN tensors of a taming ``.ckpt``: its ``state_dict`` without the ``loss.*`` entries."""
    path = input_file(path, "VQGAN checkpoint")
    with open(path, "rb") as handle:
        head = handle.read(2)
    if not head:
        raise ProCapError(f"VQGAN checkpoint {path} is empty.")
    if not zipfile.is_zipfile(path) and head[:1] != b"\x80":  # neither torch's zip format nor a legacy pickle
        raise ProCapError(
            f"VQGAN checkpoint {path} is not a torch checkpoint or is damaged (neither a complete zip archive nor a pickle)."
        )
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as archive:
            check_zip_expansion(archive, path, "VQGAN checkpoint")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError, ValueError) as exc:
        reason = (str(exc).splitlines() or [type(exc).__name__ + ": empty or truncated file"])[0][:120]
        raise ProCapError(
            f"VQGAN checkpoint {path} cannot be read safely (weights_only): it is not a torch file or holds "
            f"pickled objects beyond tensors; save just its state_dict, e.g. "
            f"torch.save({{'state_dict': ckpt['state_dict']}}, 'vqgan.ckpt') ({reason})."
        ) from None
    if not isinstance(checkpoint, dict) or not isinstance(checkpoint.get("state_dict"), dict):
        raise ProCapError(f"VQGAN checkpoint {path} has no 'state_dict' dictionary (expected a taming .ckpt).")
    state = checkpoint["state_dict"]
    if not all(isinstance(k, str) and torch.is_tensor(v) for k, v in state.items()):
        raise ProCapError(f"VQGAN checkpoint {path} has a 'state_dict' holding something other than named tensors.")
    return {k: v for k, v in state.items() if not k.startswith("loss.")}


def check_state_dict(model: nn.Module, state: dict[str, torch.Tensor], path: str | Path, show: int = 5) -> None:
    """Raise :class:`ProCapError` naming missing, unexpected and wrong-shaped keys (the first ``show`` of each)."""
    expected = model.state_dict()
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    mismatched = [
        f"{k} {tuple(state[k].shape)} vs {tuple(v.shape)}"
        for k, v in expected.items()
        if k in state and tuple(state[k].shape) != tuple(v.shape)
    ]
    if not (missing or unexpected or mismatched):
        return
    parts = []
    for name, keys in (("missing", missing), ("unexpected", unexpected), ("wrong shape (file vs model)", mismatched)):
        if keys:
            more = f" and {len(keys) - show} more" if len(keys) > show else ""
            parts.append(f"{len(keys)} {name}: {', '.join(keys[:show])}{more}")
    hint = ""
    if any(".attn." in k for k in missing + unexpected):
        hint = " (attention blocks differ: check VQGANConfig.resolution/attn_resolutions, e.g. resolution=256)"
    raise ProCapError(f"VQGAN checkpoint {path} does not match the model: {'; '.join(parts)}{hint}.")
