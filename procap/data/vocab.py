"""Word-level caption vocabulary and a Penn-Treebank-style tokenizer that needs no downloaded data.

Special tokens follow the authors' order: [PAD] [CLS] [SEP] [VID] [BOS] [EOS] [UNK] [MASK] = 0..7, so
their released ``*_word2idx*.json`` files load unchanged. NCT / ProCap ``vocab.json`` files
(``<NULL> <UNK> <START> <END>`` = 0..3, then words) are read too: their words keep their order and are
shifted behind our eight specials, which reproduces the authors' ``clevr_word2idx.json`` exactly.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from pathlib import Path
from typing import Iterable, Sequence

from procap.data.records import read_json, write_json_atomic
from procap.errors import ProCapError

SPECIALS = ("[PAD]", "[CLS]", "[SEP]", "[VID]", "[BOS]", "[EOS]", "[UNK]", "[MASK]")
NCT_SPECIALS = ("<NULL>", "<UNK>", "<START>", "<END>")

# Treebank conventions, written as ordered (pattern, replacement) rewrites on lower-cased text.
_RULES: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r'^"'), " `` "),
    (re.compile(r'(\s)"'), r"\1 `` "),
    (re.compile(r'"'), " '' "),
    (re.compile(r"\.\.\."), " ... "),
    (re.compile(r"(?<!\d),|,(?!\d)"), " , "),  # keep 1,000 together
    (re.compile(r"[;:@#$%&?!\[\](){}<>]"), r" \g<0> "),
    (re.compile(r"--"), " -- "),
    (re.compile(r"\.(?=\s|$|['\"])"), " . "),  # sentence periods, not decimals (3.5)
    (re.compile(r"([^\s'])('s|'m|'d|') "), r"\1 \2 "),
    (re.compile(r"([^\s'])('s|'m|'d)$"), r"\1 \2"),
    (re.compile(r"(\S)(n't|'ll|'re|'ve)\b"), r"\1 \2"),
    (re.compile(r"\b(can)(not)\b"), r"\1 \2"),
    (re.compile(r"\b(gon|wan|got)(na|ta)\b"), r"\1 \2"),
    (re.compile(r"\b(gim|lem)(me)\b"), r"\1 \2"),
    (re.compile(r"\b(d)('ye)\b"), r"\1 \2"),
    (re.compile(r"\b(more)('n)\b"), r"\1 \2"),
    (re.compile(r"(?:^|\s)'(t)(is|was)\b"), r" '\1 \2"),
]
_HAS_WORD = re.compile(r"[0-9a-z]")


def tokenize(text: str, punctuation: bool = False) -> list[str]:
    """Lower-cased Penn-Treebank-style word tokens.

    Punctuation is split off, contractions are split the Treebank way ("don't" -> "do n't",
    "gonna" -> "gon na", "cannot" -> "can not"), numbers stay whole ("3.5", "1,000").

    Args:
        text: raw caption.
        punctuation: keep punctuation tokens (dropped by default, as pycocoevalcap's PTBTokenizer does).

    Returns:
        The tokens.
    """
    s = " " + str(text).lower().replace("\u2019", "'").replace("`", "'") + " "
    s = s.strip()
    for pattern, repl in _RULES:
        s = pattern.sub(repl, s)
    tokens = s.split()
    if not punctuation:
        tokens = [t for t in tokens if _HAS_WORD.search(t)]
    return tokens


class Vocabulary:
    """Word <-> index map with the eight specials at 0..7.

    Attributes:
        pad_id, bos_id, eos_id, unk_id, mask_id: special token ids (0, 4, 5, 6, 7).
    """

    pad_id, cls_id, sep_id, vid_id, bos_id, eos_id, unk_id, mask_id = range(8)

    def __init__(self, word2idx: dict[str, int]) -> None:
        for i, tok in enumerate(SPECIALS):
            if word2idx.get(tok) != i:
                raise ValueError(f"special token {tok} must have index {i}")
        indices = sorted(word2idx.values())
        if indices != list(range(len(indices))):
            raise ValueError("vocabulary indices must be contiguous from 0")
        self.word2idx = dict(word2idx)
        self.idx2word = [""] * len(word2idx)
        for word, i in word2idx.items():
            self.idx2word[i] = word

    @classmethod
    def build(cls, captions: Iterable[str], min_count: int = 1) -> "Vocabulary":
        """Vocabulary of the tokens seen at least `min_count` times (words sorted alphabetically)."""
        counts = Counter(tok for cap in captions for tok in tokenize(cap))
        words = sorted(w for w, c in counts.items() if c >= min_count and w not in SPECIALS)
        return cls({w: i for i, w in enumerate(list(SPECIALS) + words)})

    def __len__(self) -> int:
        return len(self.idx2word)

    def __contains__(self, word: str) -> bool:
        return word in self.word2idx

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Vocabulary) and self.word2idx == other.word2idx

    def encode(self, text: str, max_len: int = 24) -> list[int]:
        """BOS, word ids (unknown -> UNK), EOS, then PAD: exactly `max_len` ids; long captions keep EOS."""
        if max_len < 2:
            raise ValueError("max_len must leave room for BOS and EOS")
        ids = [self.word2idx.get(t, self.unk_id) for t in tokenize(text)][: max_len - 2]
        ids = [self.bos_id, *ids, self.eos_id]
        return ids + [self.pad_id] * (max_len - len(ids))

    def decode(self, ids: Sequence[int]) -> str:
        """Words up to the first EOS, specials skipped."""
        words = []
        for i in ids:
            i = int(i)
            if i == self.eos_id:
                break
            if i >= len(SPECIALS) and i < len(self.idx2word):
                words.append(self.idx2word[i])
        return " ".join(words)

    def save(self, path: str | os.PathLike) -> None:
        """Write the word -> index JSON (same format as the authors' word2idx files), atomically."""
        write_json_atomic(path, self.word2idx, indent=1)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Vocabulary":
        """Read ours / the authors' word2idx JSON, or an NCT-style vocab.json (<NULL>/<UNK>/<START>/<END>)."""
        path = Path(path)
        data = read_json(path, "vocabulary file")
        if not isinstance(data, dict) or not all(isinstance(v, int) for v in data.values()):
            raise ProCapError(f"vocabulary file {path} is malformed: expected a JSON dict from word to int index.")
        if all(data.get(tok) == i for i, tok in enumerate(NCT_SPECIALS)):
            words = [w for w, _ in sorted(data.items(), key=lambda kv: kv[1]) if w not in NCT_SPECIALS]
            data = {w: i for i, w in enumerate(list(SPECIALS) + words)}
        try:
            return cls(data)
        except ValueError as exc:
            raise ProCapError(f"vocabulary file {path} is malformed: {exc}.") from None
