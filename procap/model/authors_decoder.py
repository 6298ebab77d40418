"""The authors' caption decoder and decoding rule: the ``authors`` variant of ProCap (``config.authors``).

The authors' released code decodes with a MART-style post-LN Transformer (their ``masked_transformer.Decoder``)
that differs from :mod:`procap.model.decoder` in almost every detail (docs/model.md has the full table):

- post-LN layers: ``x = LN_a(x + SelfAttn(x))``, ``x = LN_b(x + CrossAttn(x, memory))``, ``x = LN_c(x + FFN(x))``,
  and no final LayerNorm;
- their LayerNorm (:class:`AuthorsLayerNorm`): ``weight * (x - mean) / (std + 1e-6) + bias`` with the *unbiased*
  standard deviation and the epsilon added to the std, not to the variance;
- attention projections without bias; heads are contiguous chunks of the hidden dimension; scores are
  ``(q k^T + causal) / sqrt(hidden)``: the whole hidden size, not the head size;
- a ReLU feed-forward;
- input ``out.weight[ids] * sqrt(hidden) + sinusoidal(position)`` (sines and cosines interleaved): the embedding
  is the output projection's weight, scaled; logits ``x @ out.weight.T + out.bias`` (an output bias).

Their greedy decoding (:func:`authors_greedy_decode`, the oracle) runs every step (no early stop), suppresses only
[UNK], and keeps whatever comes after the first EOS; the caption text is cut at the first EOS later
(:meth:`procap.model.procap.ProCap.caption_text`).

:class:`AuthorsCaptionDecoder` is a :class:`procap.model.decoder.CachedDecoder` like the paper's decoder: the base
owns ``setup_caches``, ``prefill``, ``decode_step`` and ``generate_cached`` over the same
:class:`~procap.model.decoder.DecodingState` and :mod:`procap.model.kv_cache` buffers, and this decoder supplies
``forward_step`` and its pick rule, so ``procap.fast`` captures its step in a CUDA graph unchanged. With a cache its attention goes through :func:`procap.kernels.attention.attention`
(the query rescaled, since that divides by sqrt(head_dim)); without one it follows the authors' order of
operations exactly.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from procap.core.config import ProCapConfig
from procap.data.vocab import Vocabulary
from procap.kernels.attention import attention, backend_for_mask
from procap.model.decoder import BOS_ID, PAD_ID, UNK_ID, CachedDecoder, CachedState, CrossAttentionLayer, token_ids
from procap.model.kv_cache import DecoderCache, KVCache, PrefixCache
from procap.model.layers import AttentionProjections, ModuleStack, merge_heads, split_heads

# The authors write -1e10 into the [UNK] logit (not -inf); the argmax is the same either way.
UNK_LOGIT = -1e10


def _at_least_fp32(x: torch.Tensor) -> torch.Tensor:
    """fp16/bf16 -> fp32 (normalisation and softmax statistics); fp32 and fp64 unchanged."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


class AuthorsLayerNorm(nn.Module):
    """``weight * (x - mean) / (std + eps) + bias`` over the last dimension, std unbiased (N - 1).

    Half-precision inputs are normalised in fp32 (the unbiased std of bf16 values is coarse) and cast back.
    """

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(..., D) -> (..., D)."""
        y = _at_least_fp32(x)
        mean = y.mean(-1, keepdim=True)
        std = y.std(-1, keepdim=True)
        # The authors' order of operations: scale the centred input, then divide, then shift.
        return (self.weight.to(y.dtype) * (y - mean) / (std + self.eps) + self.bias.to(y.dtype)).to(x.dtype)


class AuthorsAttention(AttentionProjections):
    """Multi-head attention with bias-free projections and scores divided by sqrt(hidden).

    Without a cache, :meth:`forward` follows the authors' order of operations exactly (it is the oracle for
    parity). With one (cached decoding), it runs :func:`procap.kernels.attention.attention` on the same weights.

    Args:
        dim: hidden size H (also the scale: scores / sqrt(H)).
        heads: number of heads.
        dropout: dropout on the output (training only).
        backend: :data:`procap.kernels.attention.BACKENDS` name of the cached path.
    """

    def __init__(self, dim: int, heads: int, dropout: float = 0.0, backend: str = "auto") -> None:
        super().__init__(dim, heads, dropout, backend, bias=False)
        self.dim = dim
        # procap.kernels.attention divides scores by sqrt(head_dim); scaling the query by this makes it sqrt(hidden).
        self.query_scale = math.sqrt((dim // heads) / dim)

    def forward(
        self,
        x: torch.Tensor,
        context: torch.Tensor | None = None,
        causal: bool = False,
        kv_cache: KVCache | None = None,
        input_pos: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Attend from ``x`` (B, Lq, D) to ``context`` (B, Lk, D) (``x`` itself when None) -> (B, Lq, D).

        ``kv_cache`` / ``input_pos`` as in :meth:`procap.model.layers.MultiHeadAttention.forward`: with both, a
        self-attention cache written at ``input_pos`` (each query sees the keys up to its own position); with a
        cache alone, the keys/values prefilled from the memory.
        """
        if kv_cache is None:
            return self._exact(x, x if context is None else context, causal)
        q = split_heads(self.q_proj(x), self.heads) * self.query_scale
        if input_pos is not None:
            k, v = kv_cache.update(input_pos, *self.project_kv(x))
            mask = kv_cache.visible(input_pos)
        else:
            k, v, mask = kv_cache.k, kv_cache.v, None
        backend = backend_for_mask(self.backend, mask)
        return self.dropout(self.out_proj(merge_heads(attention(q, k, v, attn_mask=mask, backend=backend))))

    def _exact(self, x: torch.Tensor, context: torch.Tensor, causal: bool) -> torch.Tensor:
        """The authors' computation: ``softmax((q k^T + causal) / sqrt(H)) v``, then ``wo``."""
        q = split_heads(self.q_proj(x), self.heads)
        k, v = self.project_kv(context)
        scores = _at_least_fp32(q @ k.transpose(-2, -1))  # (B, H, Lq, Lk)
        if causal:
            lq, lk = scores.shape[-2:]
            future = torch.ones(lq, lk, dtype=torch.bool, device=x.device).triu(lk - lq + 1)
            scores = scores + torch.zeros(lq, lk, dtype=scores.dtype, device=x.device).masked_fill(
                future, float("-inf")
            )
        probs = (scores / math.sqrt(self.dim)).softmax(dim=-1).to(v.dtype)
        return self.dropout(self.out_proj(merge_heads(probs @ v)))


class AuthorsFeedForward(nn.Module):
    """``fc1`` -> ReLU -> ``fc2`` -> dropout."""

    def __init__(self, dim: int, hidden: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.fc2(F.relu(self.fc1(x))))


class AuthorsDecoderLayer(CrossAttentionLayer):
    """Post-LN block: causal self-attention, cross-attention to the memory, feed-forward, each then LayerNorm."""

    def __init__(self, dim: int, heads: int, ffn: int, dropout: float) -> None:
        super().__init__()
        self.self_attn = AuthorsAttention(dim, heads, dropout)
        self.self_norm = AuthorsLayerNorm(dim)
        self.cross_attn = AuthorsAttention(dim, heads, dropout)
        self.cross_norm = AuthorsLayerNorm(dim)
        self.ffn = AuthorsFeedForward(dim, ffn, dropout)
        self.ffn_norm = AuthorsLayerNorm(dim)

    def forward(
        self,
        x: torch.Tensor,
        memory: torch.Tensor | None,
        self_cache: KVCache | None = None,
        cross_cache: KVCache | None = None,
        input_pos: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """(B, L, D), memory (B, N, D) -> (B, L, D); with caches, as :class:`procap.model.decoder.DecoderLayer`."""
        x = self.self_norm(x + self.self_attn(x, causal=True, kv_cache=self_cache, input_pos=input_pos))
        x = self.cross_norm(x + self.cross_attn(x, context=memory, kv_cache=cross_cache))
        return self.ffn_norm(x + self.ffn(x))


def sinusoidal_positions(length: int, dim: int) -> torch.Tensor:
    """(length, dim) fp32: ``pe[p, 2i] = sin(p * w_i)``, ``pe[p, 2i + 1] = cos(p * w_i)``, ``w_i = 10000^(-2i/dim)``.

    ``w_i`` is computed as ``exp(2i * -ln(10000) / dim)`` in fp32, the usual formulation.
    """
    position = torch.arange(length, dtype=torch.float32)[:, None]
    inv_freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10000.0) / dim))
    pe = torch.zeros(length, dim)
    pe[:, 0::2] = torch.sin(position * inv_freq)
    pe[:, 1::2] = torch.cos(position * inv_freq)
    return pe


class AuthorsCaptionDecoder(CachedDecoder):
    """The authors' word-level caption decoder.

    Attributes:
        out: Linear(dec_dim -> vocab_size) with bias; its weight is also the (sqrt(dec_dim)-scaled) embedding.
        layers: :class:`AuthorsDecoderLayer` stack.
        positions: (max_caption_len, dec_dim) sinusoidal table (a buffer, not saved in checkpoints).
    """

    positions: torch.Tensor  # registered as a buffer

    def __init__(self, config: ProCapConfig) -> None:
        super().__init__()
        d = config.dec_dim
        self.embed_scale = math.sqrt(d)
        self.out = nn.Linear(d, config.vocab_size)
        self.dropout = nn.Dropout(config.dropout)
        self.layers: ModuleStack[AuthorsDecoderLayer] = ModuleStack(
            [AuthorsDecoderLayer(d, config.dec_heads, config.dec_ffn, config.dropout) for _ in range(config.dec_layers)]
        )
        self.memory_len = config.memory_tokens
        self.register_buffer("positions", sinusoidal_positions(config.max_caption_len, d), persistent=False)
        # Their rule suppresses [UNK] only (a bool buffer: never cast, no host copy inside a CUDA graph).
        suppressed = torch.zeros(config.vocab_size, dtype=torch.bool)
        suppressed[UNK_ID] = True
        self.register_buffer("suppressed", suppressed, persistent=False)

    def embed(self, tokens: torch.Tensor, start: int | torch.Tensor = 0) -> torch.Tensor:
        """Token ids (B, L) at positions ``start ..`` -> (B, L, D) = ``out.weight[ids] * sqrt(D) + pe``."""
        if isinstance(start, torch.Tensor):  # (1,) device tensor: one step of the fast path
            pos = self.positions.index_select(0, start)
        else:
            pos = self.positions[start : start + tokens.shape[1]]
        return F.embedding(tokens, self.out.weight) * self.embed_scale + pos

    def forward(self, tokens: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        """Next-token logits for every position.

        Args:
            tokens: (B, L) int64 ids starting with BOS, L <= max_caption_len.
            memory: (B, N, dec_dim) from :meth:`procap.model.procap.ProCap.memory`.

        Returns:
            (B, L, vocab_size) logits; position i predicts token i + 1.
        """
        self.check_length(tokens)
        x = self.dropout(self.embed(tokens))
        for layer in self.layers:
            x = layer(x, memory)
        return self.out(x)

    # -- cached decoding (setup_caches, prefill, decode_step, generate_cached: CachedDecoder) ------------------
    def forward_step(
        self, tokens: torch.Tensor, input_pos: torch.Tensor, cache: DecoderCache | PrefixCache
    ) -> torch.Tensor:
        """Logits of one position through every layer with the caches: (B,) ids at (1,) ``input_pos`` -> (B, V)."""
        if not isinstance(cache, DecoderCache):  # this decoder sets up key/value caches only
            raise TypeError("the authors' decoder decodes over key/value caches, got a PrefixCache")
        x = self.embed(tokens[:, None], input_pos)  # (B, 1, D)
        for layer, self_cache, cross_cache in zip(self.layers, cache.self_attn, cache.cross_attn):
            x = layer(x, None, self_cache, cross_cache, input_pos)
        return self.out(x[:, 0])

    def pick(self, logits: torch.Tensor, state: CachedState) -> tuple[torch.Tensor, torch.Tensor]:
        """Their rule: argmax with [UNK] suppressed, kept after EOS too (``state.finished`` is not used)."""
        scores = logits.float().masked_fill(self.suppressed, UNK_LOGIT)
        return scores.argmax(dim=-1), scores

    def max_positions(self) -> int:
        return self.positions.shape[0]

    def output_weight(self) -> torch.Tensor:
        return self.out.weight

    def greedy_oracle(self, memory: torch.Tensor, max_len: int) -> torch.Tensor:
        return authors_greedy_decode(self, memory, max_len)

    def caption_text(self, vocab: Vocabulary, tokens: Sequence[int] | torch.Tensor) -> str:
        """Their rule: PAD dropped, the words up to the first EOS, other special tokens kept as literal words,
        non-ASCII characters dropped."""
        return vocab.decode(token_ids(tokens), keep_specials=True).encode("ascii", "ignore").decode("ascii")


@torch.no_grad()
def authors_greedy_decode(decoder: AuthorsCaptionDecoder, memory: torch.Tensor, max_len: int) -> torch.Tensor:
    """The authors' greedy decoding, step for step: the oracle of the ``authors`` variant.

    A buffer of ``max_len`` PADs starts with BOS; at step t the whole buffer goes through the decoder, the [UNK]
    logit of position t is set to -1e10 and the argmax becomes token t + 1. Every step runs; EOS does not stop
    anything, and PAD, BOS, EOS and the other specials may all be produced.

    Args:
        decoder: the authors' decoder (eval mode).
        memory: (B, N, dec_dim).
        max_len: caption length including BOS.

    Returns:
        (B, max_len - 1) int64: the tokens after BOS, including whatever follows the first EOS.
    """
    ids = torch.full((memory.shape[0], max_len), PAD_ID, dtype=torch.long, device=memory.device)
    ids[:, 0] = BOS_ID
    for t in range(max_len - 1):
        logits = decoder(ids, memory)[:, t].float()
        logits[:, UNK_ID] = UNK_LOGIT
        ids[:, t + 1] = logits.argmax(dim=-1)
    return ids[:, 1:]
