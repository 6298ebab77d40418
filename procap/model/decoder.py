"""The caption decoder: a small pre-LN Transformer decoder with cross-attention to the procedure memory.

Layer order (pre-LN), for every layer::

    x = x + self_attn(norm1(x), causal)          # masked self-attention over the caption prefix
    x = x + cross_attn(norm2(x), memory)         # attention to the (B, N, dec_dim) memory
    x = x + ffn(norm3(x))

then a final ``norm`` and logits ``x @ embed.weight.T`` (input and output embeddings tied, no output bias).
Token input: ``embed(ids) + pos_embed[:L]`` (learned positions), then dropout.

``self_attn`` and ``cross_attn`` each hold ``q_proj`` / ``k_proj`` / ``v_proj`` / ``out_proj`` so that
``procap.fast`` can build a static KV cache from these exact weights (the cross-attention K/V of the memory are
computed once per caption).

Token ids follow ``procap.data.Vocabulary``'s specials: [PAD] [CLS] [SEP] [VID] [BOS] [EOS] [UNK] [MASK] = 0..7.
"""

from __future__ import annotations

import torch
from torch import nn

from procap.config import ProCapConfig
from procap.model.layers import FeedForward, MultiHeadAttention

PAD_ID, CLS_ID, SEP_ID, VID_ID, BOS_ID, EOS_ID, UNK_ID, MASK_ID = range(8)
NUM_SPECIALS = 8
# Never produced by greedy decoding: every special except EOS (which ends the caption).
SUPPRESSED_IDS = (PAD_ID, CLS_ID, SEP_ID, VID_ID, BOS_ID, UNK_ID, MASK_ID)


class DecoderLayer(nn.Module):
    """Pre-LN decoder block: causal self-attention, cross-attention, feed-forward."""

    def __init__(self, dim: int, heads: int, ffn: int, dropout: float) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.self_attn = MultiHeadAttention(dim, heads, dropout)
        self.norm2 = nn.LayerNorm(dim)
        self.cross_attn = MultiHeadAttention(dim, heads, dropout)
        self.norm3 = nn.LayerNorm(dim)
        self.ffn = FeedForward(dim, ffn, dropout)

    def forward(self, x: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        """(B, L, D), memory (B, N, D) -> (B, L, D)."""
        x = x + self.self_attn(self.norm1(x), causal=True)
        x = x + self.cross_attn(self.norm2(x), context=memory)
        return x + self.ffn(self.norm3(x))


class CaptionDecoder(nn.Module):
    """Word-level caption decoder.

    Attributes:
        embed: (vocab_size, dec_dim) token embeddings, also the output projection.
        pos_embed: (max_caption_len, dec_dim) learned positions.
        layers: :class:`DecoderLayer` stack; ``norm`` the final LayerNorm.
    """

    def __init__(self, config: ProCapConfig) -> None:
        super().__init__()
        d = config.dec_dim
        self.embed = nn.Embedding(config.vocab_size, d)
        self.pos_embed = nn.Parameter(torch.empty(config.max_caption_len, d))
        self.dropout = nn.Dropout(config.dropout)
        self.layers = nn.ModuleList(
            [DecoderLayer(d, config.dec_heads, config.dec_ffn, config.dropout) for _ in range(config.dec_layers)]
        )
        self.norm = nn.LayerNorm(d)
        nn.init.normal_(self.pos_embed, std=0.02)

    def forward(self, tokens: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        """Next-token logits for every prefix position.

        Args:
            tokens: (B, L) int64 ids starting with BOS, L <= max_caption_len.
            memory: (B, N, dec_dim) from :meth:`procap.model.procap.ProCap.memory`.

        Returns:
            (B, L, vocab_size) logits; position i predicts token i + 1.
        """
        if tokens.shape[1] > self.pos_embed.shape[0]:
            raise ValueError(f"{tokens.shape[1]} tokens exceed max_caption_len {self.pos_embed.shape[0]}")
        x = self.dropout(self.embed(tokens) + self.pos_embed[: tokens.shape[1]])
        for layer in self.layers:
            x = layer(x, memory)
        return self.norm(x) @ self.embed.weight.t()


def suppress_specials(logits: torch.Tensor) -> torch.Tensor:
    """Set the logits of :data:`SUPPRESSED_IDS` to -inf: (..., V) -> (..., V)."""
    out = logits.clone()
    out[..., list(SUPPRESSED_IDS)] = float("-inf")
    return out


@torch.no_grad()
def greedy_decode(decoder: CaptionDecoder, memory: torch.Tensor, max_len: int) -> torch.Tensor:
    """Greedy decoding, recomputing the full prefix every step (no KV cache): the reference oracle.

    Args:
        decoder: the caption decoder.
        memory: (B, N, dec_dim).
        max_len: caption length including BOS (the output has ``max_len - 1`` tokens).

    Returns:
        (B, max_len - 1) int64 tokens after BOS: EOS included when produced, PAD after it; specials other
        than EOS are never produced.
    """
    batch = memory.shape[0]
    tokens = torch.full((batch, 1), BOS_ID, dtype=torch.long, device=memory.device)
    finished = torch.zeros(batch, dtype=torch.bool, device=memory.device)
    for _ in range(max_len - 1):
        logits = suppress_specials(decoder(tokens, memory)[:, -1].float())
        next_token = logits.argmax(dim=-1)
        next_token = torch.where(finished, torch.full_like(next_token, PAD_ID), next_token)
        finished |= next_token == EOS_ID
        tokens = torch.cat([tokens, next_token[:, None]], dim=1)
    return tokens[:, 1:]
