"""The procedure encoder: a pre-LN Transformer over caption tokens and (k + 2) * n_I visual tokens.

Stage-1 sequence (paper section 3.2), in this order::

    [e_align] [e_T: L caption tokens] [e_csy] [e_I: T * n visual tokens, frame-major, row-major]

Stage 2 feeds only the visual part ``{e_bef, e_m x k*n, e_aft}``. This module is the paper's encoder: it embeds
(LayerNorm -> Linear of the VQGAN features, the caption) and runs the stack. The ``tiny`` preset's departures (the
difference embedding, change tokens, learned image features, merged tokens) are built on it by its base class
:class:`procap.model.departures.DepartureEmbeddings`, in their own module. The sequences are assembled by
:class:`procap.model.sequence.SequenceAssembly` (masking, axial positions, the stage-1 layout, the ``authors``
prefix), because the mask embedding and the positional tables are model-level parameters.

Layer order (pre-LN): ``x = x + attn(norm1(x)); x = x + mlp(norm2(x))``, then a final ``norm`` on the output.
Attention is bidirectional (no mask) and goes through :func:`procap.kernels.attention.attention`.

Fused inference form (:meth:`ProcedureEncoder.use_fused`, :mod:`procap.model.fused_form`; the Captioner's
``fused_encoder``): each residual add and the LayerNorm that reads its sum in one kernel
(:func:`procap.kernels.add_layer_norm`, the decoding step's; the Captioner's default), and, opt-in, the MLP's bias +
GELU in the first GEMM's epilogue: ``gelu_epilogue`` (``torch._addmm_activation``; tanh-approximated on CUDA, so not
the model's erf GELU there: docs/gpu.md) or ``gelu_erf_epilogue`` (a Triton GEMM with the erf GELU,
:func:`procap.kernels.linear_gelu`: the model's function).

The ``authors`` variant (``config.authors.enabled``) has no stage-1 parts. Its stage-2 sequence starts with
``config.authors.prefix_tokens`` learned vectors (the authors' 24 caption slots and two control tokens, constant at
inference, placed by :meth:`procap.model.sequence.SequenceAssembly.with_prefix`) and carries their attention-mask
quirk (:func:`authors_prefix_mask`); with CLIP-style blocks (``enc_activation="quick_gelu"``,
``authors.final_norm=False``) it is their encoder.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from procap import kernels
from procap.core.config import ProCapConfig
from procap.core.errors import ProCapError
from procap.model.departures import DepartureEmbeddings, space_to_depth
from procap.model.fused_form import FusedForm
from procap.model.layers import FeedForward, ModuleStack, MultiHeadAttention


class EncoderLayer(nn.Module):
    """Pre-LN Transformer block: self-attention and MLP, each with a residual."""

    def __init__(self, dim: int, heads: int, mlp: int, dropout: float, activation: str = "gelu") -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = MultiHeadAttention(dim, heads, dropout)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = FeedForward(dim, mlp, dropout, activation)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        """(B, N, D) -> (B, N, D); ``attn_mask`` (N, N) bool, True = may attend (None: everything)."""
        x = x + self.attn(self.norm1(x), attn_mask=attn_mask)
        return x + self.mlp(self.norm2(x))


def _head(dim: int, out: int) -> nn.Sequential:
    return nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, out))


class ProcedureEncoder(FusedForm, DepartureEmbeddings):
    """Transformer stack plus its input embeddings and the three stage-1 heads (the departures' embeddings:
    :class:`procap.model.departures.DepartureEmbeddings`).

    Attributes:
        visual_norm, visual_proj: LayerNorm(z_channels) -> Linear(z_channels -> enc_dim) on VQGAN features.
        text_embed: (vocab_size, enc_dim) caption token embeddings; ``text_pos`` (max_caption_len, enc_dim).
        align_token, csy_token: (enc_dim,) learned e_align and e_csy.
        layers, norm: the pre-LN stack and its final LayerNorm (Identity without ``authors.final_norm``).
        msm_head: LN + Linear(enc_dim -> n_embed); align_head, csy_head: LN + Linear(enc_dim -> 1).
        prefix: (authors.prefix_tokens, enc_dim), the ``authors`` variant only (which has no stage-1 parts).

    The stack has a fused inference form (:meth:`use_fused`); an encoder is built with the readable one.
    """

    fused_options = ("add_norm", "gelu_epilogue", "gelu_erf_epilogue")

    def __init__(self, config: ProCapConfig) -> None:
        super().__init__()
        d, z = config.enc_dim, config.vqgan.z_channels
        merge = config.departures.token_merge  # a token's latent cells per side (1: the paper's)
        self.visual_norm = nn.LayerNorm(z * merge**2)
        self.visual_proj = nn.Linear(z * merge**2, d)
        if config.authors.enabled:
            self.prefix = nn.Parameter(torch.empty(config.authors.prefix_tokens, d))
            nn.init.normal_(self.prefix, std=0.02)
        else:
            self.text_embed = nn.Embedding(config.vocab_size, d)
            self.text_pos = nn.Parameter(torch.empty(config.max_caption_len, d))
            self.align_token = nn.Parameter(torch.empty(d))
            self.csy_token = nn.Parameter(torch.empty(d))
        self.layers: ModuleStack[EncoderLayer] = ModuleStack(
            [
                EncoderLayer(d, config.enc_heads, config.enc_mlp, config.dropout, config.enc_activation)
                for _ in range(config.enc_layers)
            ]
        )
        self.norm = nn.LayerNorm(d) if config.authors.final_norm else nn.Identity()
        self.fused_add_norm = False  # use_fused
        self.build_departures(config)
        if not config.authors.enabled:
            self.msm_head = _head(d, config.vqgan.n_embed * merge**2)  # a code per merged cell
            self.align_head = _head(d, 1)
            self.csy_head = _head(d, 1)
            for p in (self.text_pos, self.align_token, self.csy_token):
                nn.init.normal_(p, std=0.02)

    def embed_visual(self, features: torch.Tensor, learned: torch.Tensor | None = None) -> torch.Tensor:
        """VQGAN features (B, T, z, h, w) -> visual tokens (B, T*n, enc_dim), frame-major then row-major.

        The paper's LayerNorm -> Linear per latent cell. With ``departures.token_merge`` m each token holds m x m
        latent cells (n = h*w / m^2; :func:`procap.model.departures.space_to_depth`), standardised first with
        ``departures.standardize_features``; with ``departures.image_encoder``, ``learned`` (B, T, c, h, w)
        (:meth:`image_features` of the same frames) joins them (:meth:`with_image_features`).
        """
        b = features.shape[0]
        tokens = space_to_depth(self.feature_norm(features.flatten(0, 1)), self.token_merge)  # (B*T, n, z*m^2)
        embedded = self.visual_proj(self.visual_norm(tokens.reshape(b, -1, tokens.shape[-1])))
        return self.with_image_features(embedded, learned)

    def embed_caption(self, captions: torch.Tensor) -> torch.Tensor:
        """Caption ids (B, L) -> (B, L, enc_dim) token embeddings plus learned positions (PAD embedded too)."""
        if captions.shape[1] > self.text_pos.shape[0]:
            raise ValueError(f"captions have {captions.shape[1]} tokens, at most {self.text_pos.shape[0]} allowed")
        return self.text_embed(captions) + self.text_pos[: captions.shape[1]]

    def use_fused(self, enabled: bool = True, **options: Any) -> None:
        """Run the stack in its fused inference form, or with ``enabled=False`` as written. Gradients always take
        the readable forward: the fused form serves calls without them.

        Args:
            enabled: the fused form (True) or the readable stack (False).
            options: ``add_norm`` (default True): each residual add and the LayerNorm after it (the next sublayer's,
                or the final one) in one kernel, :func:`procap.kernels.add_layer_norm`: read two tensors, write two,
                instead of an add and a LayerNorm (read three, write two); the sublayer's output buffer becomes the
                residual stream. ``gelu_epilogue`` (default False): the MLP's ``fc1`` bias and GELU in the GEMM
                (:attr:`FeedForward.gelu_epilogue`); exact on the CPU, tanh-approximated on CUDA, where the model's
                GELU is erf. ``gelu_erf_epilogue`` (default False): the same place, the model's erf GELU in a Triton
                GEMM's epilogue (:func:`procap.kernels.linear_gelu`; the reference on the CPU); not with
                ``gelu_epilogue``.
        """
        super().use_fused(enabled, **options)

    def check_fused_options(self, enabled: bool, options: Mapping[str, Any]) -> None:
        """:meth:`FusedForm.check_fused_options`, and one GELU epilogue at most."""
        super().check_fused_options(enabled, options)
        if options.get("gelu_epilogue") and options.get("gelu_erf_epilogue"):
            raise ProCapError("ProcedureEncoder.use_fused takes one GELU epilogue: gelu_epilogue or gelu_erf_epilogue.")

    def _choose_fused(
        self, enabled: bool, add_norm: bool = True, gelu_epilogue: bool = False, gelu_erf_epilogue: bool = False
    ) -> None:
        self.fused_add_norm = enabled and bool(add_norm)
        for layer in self.layers:
            layer.mlp.gelu_epilogue = enabled and bool(gelu_epilogue)
            layer.mlp.gelu_erf_epilogue = enabled and bool(gelu_erf_epilogue)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Run the stack: (B, N, D) -> (B, N, D) after the final LayerNorm (if any); ``attn_mask`` (N, N) bool."""
        if self.fused_add_norm and not torch.is_grad_enabled():
            return self._forward_add_norm(x, attn_mask)
        for layer in self.layers:
            x = layer(x, attn_mask)
        return self.norm(x)

    def _forward_add_norm(self, x: torch.Tensor, attn_mask: torch.Tensor | None) -> torch.Tensor:
        """:meth:`forward` with every ``x + sublayer(...)`` fused with the LayerNorm that reads it.

        The sublayer's output is a fresh buffer: the kernel adds the stream into it in place (``out + x``, the same
        bits as the readable ``x + out``) and returns the norm; the input ``x`` is never written.
        """
        layers = list(self.layers)
        y = layers[0].norm1(x)
        for i, layer in enumerate(layers):
            out = layer.attn(y, attn_mask=attn_mask).contiguous()
            y = kernels.add_layer_norm(out, x, layer.norm2.weight, layer.norm2.bias, layer.norm2.eps)
            x = out
            out = layer.mlp(y).contiguous()
            norm = layers[i + 1].norm1 if i + 1 < len(layers) else self.norm
            if isinstance(norm, nn.LayerNorm):
                y = kernels.add_layer_norm(out, x, norm.weight, norm.bias, norm.eps)
            else:  # no final norm (CLIP-style blocks)
                y = out.add_(x)
            x = out
        return y


def authors_prefix_mask(prefix: int, length: int, device: torch.device | str | None = None) -> torch.Tensor:
    """The authors' stage-2 encoder mask, (length, length) bool, True = may attend.

    Their mask is built for the stage-1 layout, which has one more leading token, and cut to the stage-2 length:
    the last control token (position ``prefix - 1``) cannot see the tokens before it, and the first patch of the
    before frame (position ``prefix``) cannot see the prefix. Everything else is bidirectional. An off-by-one
    against their own stage-1 layout, but what the released models ran with.
    """
    mask = torch.ones(length, length, dtype=torch.bool, device=device)
    mask[prefix - 1, : prefix - 1] = False
    mask[prefix, :prefix] = False
    return mask
