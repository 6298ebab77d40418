"""The procedure encoder: a pre-LN Transformer over caption tokens and (k + 2) * n_I visual tokens.

Stage-1 sequence (paper section 3.2), in this order::

    [e_align] [e_T: L caption tokens] [e_csy] [e_I: T * n visual tokens, frame-major, row-major]

Stage 2 feeds only the visual part ``{e_bef, e_m x k*n, e_aft}``. The visual tokens are built by
:class:`procap.model.procap.ProCap` (LayerNorm -> Linear of the VQGAN features here, masking and axial positions
there), because the mask embedding and the positional tables are model-level parameters.

Layer order (pre-LN): ``x = x + attn(norm1(x)); x = x + mlp(norm2(x))``, then a final ``norm`` on the output.
Attention is bidirectional (no mask) and goes through :func:`procap.attention.attention`.

The ``authors`` variant (``config.variant``) has no stage-1 parts. Its stage-2 sequence starts with
``config.enc_prefix_tokens`` learned vectors (the authors' 24 caption slots and two control tokens, constant at
inference) and carries their attention-mask quirk (:func:`authors_prefix_mask`); with CLIP-style blocks
(``enc_activation="quick_gelu"``, ``enc_final_norm=False``) it is their encoder.
"""

from __future__ import annotations

import torch
from torch import nn

from procap.config import ProCapConfig
from procap.model.layers import FeedForward, MultiHeadAttention


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


class ProcedureEncoder(nn.Module):
    """Transformer stack plus its input embeddings and the three stage-1 heads.

    Attributes:
        visual_norm, visual_proj: LayerNorm(z_channels) -> Linear(z_channels -> enc_dim) on VQGAN features.
        text_embed: (vocab_size, enc_dim) caption token embeddings; ``text_pos`` (max_caption_len, enc_dim).
        align_token, csy_token: (enc_dim,) learned e_align and e_csy.
        layers, norm: the pre-LN stack and its final LayerNorm.
        msm_head: LN + Linear(enc_dim -> n_embed); align_head, csy_head: LN + Linear(enc_dim -> 1).
        prefix: (enc_prefix_tokens, enc_dim), the ``authors`` variant only (which has no stage-1 parts).
    """

    def __init__(self, config: ProCapConfig) -> None:
        super().__init__()
        d, z = config.enc_dim, config.vqgan.z_channels
        self.visual_norm = nn.LayerNorm(z)
        self.visual_proj = nn.Linear(z, d)
        if config.variant == "authors":
            self.prefix = nn.Parameter(torch.empty(config.enc_prefix_tokens, d))
            nn.init.normal_(self.prefix, std=0.02)
        else:
            self.text_embed = nn.Embedding(config.vocab_size, d)
            self.text_pos = nn.Parameter(torch.empty(config.max_caption_len, d))
            self.align_token = nn.Parameter(torch.empty(d))
            self.csy_token = nn.Parameter(torch.empty(d))
        self.layers = nn.ModuleList(
            [
                EncoderLayer(d, config.enc_heads, config.enc_mlp, config.dropout, config.enc_activation)
                for _ in range(config.enc_layers)
            ]
        )
        self.norm = nn.LayerNorm(d) if config.enc_final_norm else nn.Identity()
        if config.difference_embedding:  # departure (docs/model.md): |after - before| per position
            self.difference_norm = nn.LayerNorm(z)
            self.difference_proj = nn.Linear(z, d)
        if config.variant != "authors":
            self.msm_head = _head(d, config.vqgan.n_embed)
            self.align_head = _head(d, 1)
            self.csy_head = _head(d, 1)
            for p in (self.text_pos, self.align_token, self.csy_token):
                nn.init.normal_(p, std=0.02)

    def embed_visual(self, features: torch.Tensor) -> torch.Tensor:
        """VQGAN features (B, T, z, h, w) -> visual tokens (B, T*h*w, enc_dim), frame-major then row-major."""
        b, t, z, h, w = features.shape
        tokens = features.permute(0, 1, 3, 4, 2).reshape(b, t * h * w, z)
        return self.visual_proj(self.visual_norm(tokens))

    def embed_difference(self, before: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
        """Per-position change embedding: VQGAN features (B, z, h, w) x 2 -> (B, h*w, enc_dim).

        LayerNorm -> Linear of ``|after - before|``, row-major like the frame tokens. Only built with
        ``config.difference_embedding``.
        """
        change = (after - before).abs().flatten(2).transpose(1, 2)  # (B, h*w, z)
        return self.difference_proj(self.difference_norm(change))

    def embed_caption(self, captions: torch.Tensor) -> torch.Tensor:
        """Caption ids (B, L) -> (B, L, enc_dim) token embeddings plus learned positions (PAD embedded too)."""
        if captions.shape[1] > self.text_pos.shape[0]:
            raise ValueError(f"captions have {captions.shape[1]} tokens, at most {self.text_pos.shape[0]} allowed")
        return self.text_embed(captions) + self.text_pos[: captions.shape[1]]

    def stage1_sequence(self, caption_tokens: torch.Tensor, visual_tokens: torch.Tensor) -> torch.Tensor:
        """``[e_align, e_T, e_csy, e_I]``: (B, L, D) and (B, N, D) -> (B, L + 2 + N, D).

        The align output is read at position 0, the csy output at ``L + 1``, the visual outputs from ``L + 2``.
        """
        b, d = caption_tokens.shape[0], caption_tokens.shape[2]
        align = self.align_token.view(1, 1, d).expand(b, 1, d)
        csy = self.csy_token.view(1, 1, d).expand(b, 1, d)
        return torch.cat([align, caption_tokens, csy, visual_tokens], dim=1)

    def with_prefix(self, visual_tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``authors`` variant: ``[prefix, visual]`` (B, P + N, D) and its (P + N, P + N) attention mask."""
        b, _, d = visual_tokens.shape
        prefix = self.prefix.to(visual_tokens.dtype).view(1, -1, d).expand(b, -1, d)
        seq = torch.cat([prefix, visual_tokens], dim=1)
        return seq, authors_prefix_mask(self.prefix.shape[0], seq.shape[1], seq.device)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Run the stack: (B, N, D) -> (B, N, D) after the final LayerNorm (if any); ``attn_mask`` (N, N) bool."""
        for layer in self.layers:
            x = layer(x, attn_mask)
        return self.norm(x)


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
