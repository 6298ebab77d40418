"""The caption decoder: a small pre-LN Transformer decoder with cross-attention to the procedure memory.

Layer order (pre-LN), for every layer::

    x = x + self_attn(norm1(x), causal)          # masked self-attention over the caption prefix
    x = x + cross_attn(norm2(x), memory)         # attention to the (B, N, dec_dim) memory
    x = x + ffn(norm3(x))

then a final ``norm`` and logits ``x @ embed.weight.T`` (input and output embeddings tied, no output bias), computed
in fp32 whatever the model's dtype (:meth:`CaptionDecoder.logits`).
Token input: ``embed(ids) + pos_embed[:L]`` (learned positions), then dropout.

Two ways to decode greedily, one set of weights and one greedy rule (:func:`greedy_pick`):

- :func:`greedy_decode`, the readable oracle: the full prefix through :meth:`CaptionDecoder.forward` every step;
- the cached loop: :meth:`CaptionDecoder.setup_caches` allocates a state (KV caches, tokens, position, finished
  flags, output) for a batch, :meth:`CaptionDecoder.prefill` projects the memory into the cross-attention caches,
  and every :meth:`CaptionDecoder.decode_step` runs one position, reading and writing only the state's buffers (no
  host sync), so ``procap.fast`` captures exactly this step in a CUDA graph. For this decoder the step is the fused
  form of :mod:`procap.model.decoder_step` (merged projections, fused residual + LayerNorm and pick, through
  ``procap.kernels``): the same computation in about half the launches; the tests compare it with the oracle.
  :meth:`CaptionDecoder.use_fused` (:mod:`procap.model.fused_form`) with ``False`` makes the loop run the readable
  form instead: each step the oracle's whole-prefix pass over fixed-shape buffers
  (:class:`~procap.model.kv_cache.PrefixCache`), so every cached caller (beam search, ``procap.fast``) can run it.

Token ids follow ``procap.data.Vocabulary``'s specials: [PAD] [CLS] [SEP] [VID] [BOS] [EOS] [UNK] [MASK] = 0..7.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import torch
from torch import nn

from procap.core.config import ProCapConfig
from procap.core.errors import ProCapError
from procap.core.validate import caption_length, same_device
from procap.data.vocab import Vocabulary
from procap.kernels import fp8
from procap.kernels.attention import resolve_backend
from procap.model import decoder_step
from procap.model.fused_form import FusedForm
from procap.model.kv_cache import DecoderCache, KVCache, PrefixCache
from procap.model.layers import AttentionProjections, FeedForward, ModuleStack, MultiHeadAttention

PAD_ID, CLS_ID, SEP_ID, VID_ID, BOS_ID, EOS_ID, UNK_ID, MASK_ID = range(8)
NUM_SPECIALS = 8
# Never produced by greedy decoding: every special except EOS (which ends the caption).
SUPPRESSED_IDS = (PAD_ID, CLS_ID, SEP_ID, VID_ID, BOS_ID, UNK_ID, MASK_ID)


class CrossAttentionLayer(nn.Module):
    """A decoder layer as cached decoding reads it (:class:`CachedDecoder`): a self-attention and a
    cross-attention, whose projections and heads size and fill the caches. Declarations only: :class:`DecoderLayer`
    and the authors' layer set both."""

    self_attn: AttentionProjections
    cross_attn: AttentionProjections


class DecoderLayer(CrossAttentionLayer):
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
        """(B, L, D), memory (B, N, D) -> (B, L, D). (Cached decoding: :mod:`procap.model.decoder_step`.)"""
        x = x + self.self_attn(self.norm1(x), causal=True)
        x = x + self.cross_attn(self.norm2(x), context=memory)
        return x + self.ffn(self.norm3(x))


class CachedState(Protocol):
    """What the loops that drive a cached decode read and write (:meth:`CachedDecoder.generate_cached`, beam
    search, sampling, ``procap.fast``): a :class:`DecodingState`, or the fused step's
    :class:`~procap.model.decoder_step.FusedDecodingState`. The attributes are :class:`DecodingState`'s."""

    batch: int
    steps: int
    tokens: torch.Tensor
    pos: torch.Tensor
    finished: torch.Tensor
    out: torch.Tensor
    logits: torch.Tensor

    def reset(self) -> None: ...

    def reorder_rows(self, rows: torch.Tensor) -> None: ...


class DecodingState:
    """Every buffer one cached greedy decode touches, for ``batch`` rows and captions of ``max_len`` tokens.

    Built by :meth:`CaptionDecoder.setup_caches`. Shapes never change, so the step can be captured in a CUDA graph.

    Attributes:
        cache: the per-layer self- and cross-attention :class:`~procap.model.kv_cache.KVCache` s (a
            :class:`~procap.model.kv_cache.PrefixCache` in the caption decoder's readable form).
        tokens: (B,) ids fed to the next step; ``pos``: (1,) int64 device tensor, its position.
        finished: (B,) rows that produced EOS; ``out``: (B, max_len - 1) produced tokens (PAD after EOS).
        logits: (B, V) fp32 logits of the last step after suppression (for agreement checks).
        steps: ``max_len - 1``, the number of :meth:`CaptionDecoder.decode_step` calls of one caption.
    """

    def __init__(
        self, cache: DecoderCache | PrefixCache, batch: int, max_len: int, vocab: int, device: torch.device | str
    ) -> None:
        self.cache, self.batch, self.steps = cache, batch, max_len - 1
        self.tokens = torch.full((batch,), BOS_ID, dtype=torch.long, device=device)
        self.pos = torch.zeros(1, dtype=torch.long, device=device)
        self.finished = torch.zeros(batch, dtype=torch.bool, device=device)
        self.out = torch.full((batch, self.steps), PAD_ID, dtype=torch.long, device=device)
        self.logits = torch.zeros(batch, vocab, dtype=torch.float32, device=device)

    def reset(self) -> None:
        """Back to "BOS at position 0, nothing finished", in place (captured graphs keep these buffers)."""
        self.tokens.fill_(BOS_ID)
        self.pos.zero_()
        self.finished.zero_()
        self.out.fill_(PAD_ID)

    def reorder_rows(self, rows: torch.Tensor) -> None:
        """Row i of the cache becomes row ``rows[i]`` (beam search follows its hypotheses)."""
        self.cache.reorder_rows(rows)


class CachedDecoder(nn.Module):
    """The cached decoding interface of the caption decoders, and its generic form over :class:`DecodingState`.

    The interface (what :func:`procap.model.beam.beam_search_cached` and ``procap.fast`` call): :meth:`setup_caches`,
    :meth:`prefill`, :meth:`decode_step` (greedy), :meth:`step_logits` (one position's logits for given tokens),
    :meth:`generate_cached`. The generic form here runs :meth:`forward_step` with :mod:`procap.model.kv_cache`
    buffers; :class:`procap.model.authors_decoder.AuthorsCaptionDecoder` uses it and supplies ``layers`` (every
    layer with ``self_attn.heads`` and ``cross_attn.project_kv``), ``memory_len``, :meth:`forward_step`,
    :meth:`pick` (its rule), :meth:`max_positions` and :meth:`output_weight` (the (V, D) tied embedding / output
    projection, which sizes the caches). :class:`CaptionDecoder` overrides the cached methods with its fused step.
    """

    layers: ModuleStack[CrossAttentionLayer]
    memory_len: int  # N, the memory tokens a cache holds unless told otherwise
    suppressed: torch.Tensor  # (V,) bool buffer: the ids the decoder's rule never produces

    def forward_step(
        self, tokens: torch.Tensor, input_pos: torch.Tensor, cache: DecoderCache | PrefixCache
    ) -> torch.Tensor:
        """Logits of one position: (B,) ids at (1,) ``input_pos`` -> (B, V); ``cache`` of the kind this decoder's
        :meth:`setup_caches` makes."""
        raise NotImplementedError

    def pick(self, logits: torch.Tensor, state: CachedState) -> tuple[torch.Tensor, torch.Tensor]:
        """The decoding rule: (B, V) logits -> ``(next_token (B,), scores (B, V) fp32)``; may update ``state``."""
        raise NotImplementedError

    def max_positions(self) -> int:
        """``max_caption_len``: the longest caption (BOS included) the positions cover."""
        raise NotImplementedError

    def output_weight(self) -> torch.Tensor:
        """The (V, D) weight tying the token embedding to the output projection."""
        raise NotImplementedError

    def check_length(self, tokens: torch.Tensor) -> None:
        """Refuse (B, L) ids longer than the positions cover (``max_caption_len``)."""
        if tokens.shape[1] > self.max_positions():
            raise ValueError(f"{tokens.shape[1]} tokens exceed max_caption_len {self.max_positions()}")

    def check_max_len(self, max_len: int) -> None:
        """Refuse a decoding length (BOS included) outside ``[2, max_caption_len]``."""
        caption_length(max_len, "max_len", ceiling=self.max_positions())

    def greedy_oracle(self, memory: torch.Tensor, max_len: int) -> torch.Tensor:
        """Eager greedy decoding under this decoder's rule, full prefix every step: (B, N, D) -> (B, max_len - 1)."""
        raise NotImplementedError

    def caption_text(self, vocab: Vocabulary, tokens: Sequence[int] | torch.Tensor) -> str:
        """Caption text of one decoded row (the tokens after BOS) under this decoder's rule."""
        raise NotImplementedError

    def setup_caches(
        self,
        batch: int,
        max_len: int,
        dtype: torch.dtype,
        device: torch.device | str,
        memory_len: int | None = None,
    ) -> CachedState:
        """Allocate the buffers of a cached greedy decode.

        Args:
            batch: rows B.
            max_len: caption length including BOS, at most ``max_caption_len``; ``max_len - 1`` steps.
            dtype, device: the decoder weights' dtype and device.
            memory_len: N, memory tokens (default ``num_frames * tokens_per_frame`` of the config).

        Returns:
            A fresh :class:`DecodingState`; call :meth:`prefill` before decoding.
        """
        self.check_max_len(max_len)
        heads = self.layers[0].self_attn.heads
        vocab, dim = self.output_weight().shape
        head_dim = dim // heads
        n = self.memory_len if memory_len is None else memory_len
        cache = DecoderCache(
            [KVCache(batch, heads, max_len - 1, head_dim, dtype, device) for _ in self.layers],
            [KVCache(batch, heads, n, head_dim, dtype, device) for _ in self.layers],
        )
        return DecodingState(cache, batch, max_len, vocab, device)

    @torch.no_grad()
    def prefill(self, memory: torch.Tensor, state: CachedState) -> None:
        """Project the memory (b, N, D), b <= state.batch, into every layer's cross-attention cache; reset ``state``.

        Rows b..B-1 keep whatever keys/values they held (finite values): their tokens are computed and discarded.
        """
        cache = set_up_here(state).cache
        if not isinstance(cache, DecoderCache):
            raise TypeError("prefill: this decoding state holds no key/value caches (set up by another decoder)")
        for layer, kv_cache in zip(self.layers, cache.cross_attn):
            kv_cache.fill(*layer.cross_attn.project_kv(memory))
        state.reset()

    @torch.no_grad()
    def step_logits(self, tokens: torch.Tensor, state: CachedState) -> torch.Tensor:
        """fp32 logits (B, V) of ``tokens`` (B,) at ``state.pos``, their keys/values cached; the caller picks and
        advances ``state.pos`` (beam search)."""
        return self.forward_step(tokens, state.pos, set_up_here(state).cache)

    @torch.no_grad()
    def decode_step(self, state: CachedState) -> None:
        """Decode position ``state.pos``: logits, the decoder's :meth:`pick`, bookkeeping; advances ``state.pos``."""
        logits = self.forward_step(state.tokens, state.pos, set_up_here(state).cache)
        next_token, scores = self.pick(logits, state)
        state.logits.copy_(scores)
        state.out.index_copy_(1, state.pos, next_token[:, None])
        state.tokens.copy_(next_token)
        state.pos += 1

    @torch.no_grad()
    def generate_cached(self, memory: torch.Tensor, max_len: int) -> torch.Tensor:
        """Greedy tokens with KV caches, eagerly: (B, N, D) -> (B, max_len - 1), equal to the decoder's oracle
        (:func:`greedy_decode`, :func:`procap.model.authors_decoder.authors_greedy_decode`)."""
        state = self.setup_caches(memory.shape[0], max_len, memory.dtype, memory.device, memory.shape[1])
        self.prefill(memory, state)
        for _ in range(state.steps):
            self.decode_step(state)
        return state.out


def set_up_here(state: CachedState) -> DecodingState:
    """``state`` as the generic cached form's :class:`DecodingState` (what :meth:`CachedDecoder.setup_caches` and
    the readable form make); a state of another form was handed to the wrong decoder."""
    if not isinstance(state, DecodingState):
        raise TypeError(f"a {type(state).__name__} goes to the decoder form that set it up, not the generic one")
    return state


class CaptionDecoder(FusedForm, CachedDecoder):
    """Word-level caption decoder.

    Its cached decoding has a fused form and a readable one (:meth:`use_fused`); a decoder is built with the fused
    one: the cached interface serves only fast decoding, and the fused form takes the weights when each state is set
    up, so they cannot go stale (the VQGAN's and the encoder's fused forms start off). ``forward`` is always readable.

    Attributes:
        embed: (vocab_size, dec_dim) token embeddings, also the output projection.
        pos_embed: (max_caption_len, dec_dim) learned positions.
        layers: :class:`DecoderLayer` stack; ``norm`` the final LayerNorm.
    """

    fused_options = ("logits_pick", "kv_cache_dtype", "split_k_attention", "mlp")
    fused_logits_pick = False  # the fused form's options, set by use_fused
    fused_split_k_attention = False
    fused_mlp = False

    def __init__(self, config: ProCapConfig) -> None:
        super().__init__()
        d = config.dec_dim
        self.cross_kv_dtype: torch.dtype | None = None  # use_fused's kv_cache_dtype
        self.embed = nn.Embedding(config.vocab_size, d)
        self.pos_embed = nn.Parameter(torch.empty(config.max_caption_len, d))
        self.dropout = nn.Dropout(config.dropout)
        self.layers: ModuleStack[DecoderLayer] = ModuleStack(
            [DecoderLayer(d, config.dec_heads, config.dec_ffn, config.dropout) for _ in range(config.dec_layers)]
        )
        self.norm = nn.LayerNorm(d)
        self.memory_len = config.memory_tokens
        nn.init.normal_(self.pos_embed, std=0.02)
        # True on SUPPRESSED_IDS. A bool buffer (never cast by .to(dtype)) rather than an index list, so the pick
        # needs no host-to-device copy inside a CUDA graph; not persistent: checkpoints do not carry it.
        self.register_buffer("suppressed", suppressed_mask(config.vocab_size), persistent=False)
        self.use_fused()

    def forward(self, tokens: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        """Next-token logits for every prefix position.

        Args:
            tokens: (B, L) int64 ids starting with BOS, L <= max_caption_len.
            memory: (B, N, dec_dim) from :meth:`procap.model.procap.ProCap.memory`.

        Returns:
            (B, L, vocab_size) logits; position i predicts token i + 1.
        """
        self.check_length(tokens)
        x = self.dropout(self.embed(tokens) + self.pos_embed[: tokens.shape[1]])
        for layer in self.layers:
            x = layer(x, memory)
        return self.logits(self.norm(x))

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The tied output projection in fp32: (..., D) -> (..., V) fp32 logits, also under autocast.

        In a bf16 model a bf16 matmul rounds two logits closer than bf16's resolution to the same value, so the
        greedy argmax flips against the fp32 oracle on near-ties; this projection is tiny (V x D), fp32 costs nothing.
        """
        with torch.autocast(hidden.device.type, enabled=False):
            return hidden.float() @ self.embed.weight.float().t()

    # -- cached decoding: the fused step of procap.model.decoder_step, or the readable pass over the prefix ------------
    def use_fused(self, enabled: bool = True, **options: Any) -> None:
        """Decode with the fused step of :mod:`procap.model.decoder_step` (True, the default), or with ``False`` run
        every cached step as the readable :meth:`forward` over the whole prefix (:class:`PrefixCache`: the oracle's
        computation, a position's logits read from it; slower, exact, for comparison). Options: ``logits_pick``
        (default False): the greedy step's fp32 logits and the pick of each vocabulary tile in one Triton kernel
        instead of the logits GEMM (:func:`procap.kernels.greedy_logits_step`; the same tokens, the logits in
        another summation order), opt-in until a GPU has timed it; ``kv_cache_dtype``: None (the default: the
        memory's keys/values in the weights' dtype) or ``torch.float8_e4m3fn`` (e4m3 codes with one scale per token
        and head, :class:`procap.model.decoder_step.Fp8CrossCache`); ``split_k_attention`` (default False): the cross
        attention through the split-K kernels of :func:`procap.kernels.decode_attention` (the same tokens, the
        softmax in another summation order), opt-in until a GPU has timed it; ``mlp`` (default False): each layer's
        fc1, erf GELU and fc2 in one Triton kernel (:func:`procap.kernels.decode_mlp`; the same function, the GEMMs
        in another summation order), opt-in until a GPU has timed it.

        The choice is taken by the next :meth:`setup_caches`: a state keeps the form it was set up in.
        """
        super().use_fused(enabled, **options)

    def _choose_fused(
        self,
        enabled: bool,
        logits_pick: bool = False,
        kv_cache_dtype: torch.dtype | None = None,
        split_k_attention: bool = False,
        mlp: bool = False,
    ) -> None:
        """Nothing to build now: :meth:`setup_caches` reads :attr:`fused`, the ``fused_*`` options and the cross
        cache's dtype."""
        if kv_cache_dtype not in (None, fp8.E4M3):
            raise ProCapError(f"kv_cache_dtype must be None or torch.float8_e4m3fn, got {kv_cache_dtype!r}.")
        self.fused_logits_pick = enabled and bool(logits_pick)
        self.fused_split_k_attention = enabled and bool(split_k_attention)
        self.fused_mlp = enabled and bool(mlp)
        self.cross_kv_dtype = kv_cache_dtype

    def setup_caches(
        self,
        batch: int,
        max_len: int,
        dtype: torch.dtype,
        device: torch.device | str,
        memory_len: int | None = None,
    ) -> DecodingState | decoder_step.FusedDecodingState:
        """Buffers of a cached decode in the chosen form (:meth:`use_fused`); the fused form also takes the weights
        in its layout now (set up again after the weights change). ``dtype`` and ``device`` must be the weights';
        other arguments as :meth:`CachedDecoder.setup_caches`."""
        self.check_max_len(max_len)
        weight = self.embed.weight
        if dtype != weight.dtype or not same_device(device, weight.device):
            raise ValueError(
                f"decoding buffers live with the weights ({weight.dtype} on {weight.device}), got {dtype} on {device}"
            )
        n = self.memory_len if memory_len is None else memory_len
        if not self.fused:
            prefix = PrefixCache(batch, max_len, n, weight.shape[1], dtype, weight.device)
            return DecodingState(prefix, batch, max_len, weight.shape[0], weight.device)
        backend = resolve_backend(self.layers[0].self_attn.backend, weight.device, dtype, use="decode")
        weights = decoder_step.FusedWeights(
            self, backend, BOS_ID, PAD_ID, self.fused_logits_pick, self.fused_split_k_attention, self.fused_mlp
        )
        return decoder_step.FusedDecodingState(weights, len(self.layers), batch, max_len, n, self.cross_kv_dtype)

    @torch.no_grad()
    def prefill(self, memory: torch.Tensor, state: CachedState) -> None:
        """Project the memory (b, N, D), b <= state.batch, into the cross-attention caches (the readable form keeps the
        memory itself); reset ``state``. Rows b..B-1 keep whatever they held (finite values): their tokens are
        discarded."""
        if isinstance(state, decoder_step.FusedDecodingState):
            decoder_step.prefill(state, memory)
        else:
            _prefix(set_up_here(state).cache).fill(memory)
        state.reset()

    @torch.no_grad()
    def decode_step(self, state: CachedState) -> None:
        """Decode position ``state.pos`` greedily (the rule of :func:`greedy_pick`); advances ``state.pos``."""
        if isinstance(state, decoder_step.FusedDecodingState):
            decoder_step.greedy_step(state)
        else:
            super().decode_step(state)

    @torch.no_grad()
    def step_logits(self, tokens: torch.Tensor, state: CachedState) -> torch.Tensor:
        if isinstance(state, decoder_step.FusedDecodingState):
            return decoder_step.step_logits(state, tokens)
        return super().step_logits(tokens, state)

    def forward_step(
        self, tokens: torch.Tensor, input_pos: torch.Tensor, cache: DecoderCache | PrefixCache
    ) -> torch.Tensor:
        """The readable form's fp32 logits (B, V) of ``tokens`` (B,) at (1,) ``input_pos``: written into the prefix,
        which runs through :meth:`forward` whole; the layers are causal, so the positions after it change nothing."""
        prefix = _prefix(cache)
        prefix.write(input_pos, tokens)
        return self(prefix.sequence, prefix.memory).index_select(1, input_pos).squeeze(1)

    def pick(self, logits: torch.Tensor, state: CachedState) -> tuple[torch.Tensor, torch.Tensor]:
        """:func:`greedy_pick`, the finished flags kept in ``state``."""
        next_token, finished, scores = greedy_pick(logits, state.finished, self.suppressed)
        state.finished.copy_(finished)
        return next_token, scores

    def max_positions(self) -> int:
        return self.pos_embed.shape[0]

    def output_weight(self) -> torch.Tensor:
        return self.embed.weight

    def greedy_oracle(self, memory: torch.Tensor, max_len: int) -> torch.Tensor:
        return greedy_decode(self, memory, max_len)

    def caption_text(self, vocab: Vocabulary, tokens: Sequence[int] | torch.Tensor) -> str:
        """The words up to the first EOS, special tokens skipped."""
        return vocab.decode(token_ids(tokens))


def _prefix(cache: DecoderCache | PrefixCache) -> PrefixCache:
    """The readable form's cache: it sets up a :class:`PrefixCache`, never key/value caches."""
    if not isinstance(cache, PrefixCache):
        raise TypeError("the caption decoder's readable form decodes over a PrefixCache, got key/value caches")
    return cache


def token_ids(tokens: Sequence[int] | torch.Tensor) -> list[int]:
    """One decoded row, (L,) tensor or ints, as a list of ints (what ``Vocabulary.decode`` reads)."""
    return tokens.tolist() if isinstance(tokens, torch.Tensor) else [int(token) for token in tokens]


def suppressed_mask(vocab_size: int, device: torch.device | str | None = None) -> torch.Tensor:
    """(V,) bool, True on :data:`SUPPRESSED_IDS`: the ids greedy decoding never produces."""
    mask = torch.zeros(vocab_size, dtype=torch.bool, device=device)
    mask[list(SUPPRESSED_IDS)] = True
    return mask


def greedy_pick(
    logits: torch.Tensor, finished: torch.Tensor, suppressed: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The greedy choice of one step, shared by :func:`greedy_decode` and the cached loop; no host sync.

    Args:
        logits: (B, V) next-token logits of any float dtype.
        finished: (B,) bool, rows that already produced EOS.
        suppressed: (V,) bool from :func:`suppressed_mask`.

    Returns:
        ``(next_token, finished, scores)``: (B,) int64 argmax of ``scores`` (PAD for finished rows), the updated
        (B,) flags, and the (B, V) fp32 logits with the suppressed ids at -inf.
    """
    scores = logits.float().masked_fill(suppressed, float("-inf"))
    next_token = scores.argmax(dim=-1).masked_fill(finished, PAD_ID)
    return next_token, finished | (next_token == EOS_ID), scores


def suppress_specials(logits: torch.Tensor) -> torch.Tensor:
    """Set the logits of :data:`SUPPRESSED_IDS` to -inf: (..., V) -> (..., V) (as :func:`greedy_pick` does)."""
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
    suppressed = None
    for _ in range(max_len - 1):
        logits = decoder(tokens, memory)[:, -1]
        suppressed = suppressed_mask(logits.shape[-1], memory.device) if suppressed is None else suppressed
        next_token, finished, _ = greedy_pick(logits, finished, suppressed)
        tokens = torch.cat([tokens, next_token[:, None]], dim=1)
    return tokens[:, 1:]
