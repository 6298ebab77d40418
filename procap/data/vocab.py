"""Word-level caption vocabulary and a Penn-Treebank-style tokenizer that needs no downloaded data."""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Iterable, Sequence

from procap.core.errors import ProCapError
from procap.core.files import atomic_write_json
from procap.core.json_files import read_json
from procap.core.validate import caption_length

SPECIALS = ("[PAD]", "[CLS]", "[SEP]", "[VID]", "[BOS]", "[EOS]", "[UNK]", "[MASK]")
PAD, CLS, SEP, VID, BOS, EOS, UNK, MASK = range(len(SPECIALS))
# NCT / RobustChangeCaptioning vocabularies use their own four specials.
_NCT_SPECIALS = {"<NULL>": PAD, "<UNK>": UNK, "<START>": BOS, "<END>": EOS}

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
_HAS_WORD = re.compile(r"\w")  # a token with no letter/digit is punctuation


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
    s = str(text).lower().replace("\u2019", "'").replace("`", "'").strip()
    for pattern, repl in _RULES:
        s = pattern.sub(repl, s)
    tokens = s.split()
    if not punctuation:
        tokens = [t for t in tokens if _HAS_WORD.search(t)]
    return tokens


class Vocabulary:
    """Word <-> index map with the authors' special tokens at 0..7.

    Args:
        words: the non-special words, in index order (index 8 onwards).
    """

    pad_id, bos_id, eos_id, unk_id, mask_id = PAD, BOS, EOS, UNK, MASK

    def __init__(self, words: Iterable[str] = ()) -> None:
        self.itos: list[str] = list(SPECIALS)
        self.stoi: dict[str, int] = {w: i for i, w in enumerate(self.itos)}
        for word in words:
            if word not in self.stoi:
                self.stoi[word] = len(self.itos)
                self.itos.append(word)

    def __len__(self) -> int:
        return len(self.itos)

    def __contains__(self, word: str) -> bool:
        return word in self.stoi

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Vocabulary) and self.itos == other.itos

    @classmethod
    def build(cls, captions: Iterable[str], min_count: int = 1) -> Vocabulary:
        """Words seen at least ``min_count`` times, most frequent first (ties alphabetical), after the specials."""
        counts = Counter(token for caption in captions for token in tokenize(caption))
        words = sorted(
            (w for w, c in counts.items() if c >= min_count and w not in SPECIALS), key=lambda w: (-counts[w], w)
        )
        return cls(words)

    def encode(self, text: str, max_len: int = 24) -> list[int]:
        """``[BOS] w1 .. wn [EOS] [PAD]..``, exactly ``max_len`` ids; long captions are cut, keeping EOS."""
        caption_length(max_len, "max_len")  # room for BOS and EOS
        ids = [self.stoi.get(token, UNK) for token in tokenize(text)][: max_len - 2]
        ids = [BOS, *ids, EOS]
        return ids + [PAD] * (max_len - len(ids))

    def decode(self, ids: Sequence[int], keep_specials: bool = False) -> str:
        """Words up to the first EOS; special tokens are skipped, or kept as literal words (``[MASK]``...) except
        PAD when ``keep_specials`` (the authors' caption rule)."""
        words = []
        for index in ids:
            index = int(index)
            if index == EOS:
                break
            if (index >= len(SPECIALS) or (keep_specials and index != PAD)) and index < len(self.itos):
                words.append(self.itos[index])
        return " ".join(words)

    def to_dict(self) -> dict[str, int]:
        return dict(self.stoi)

    @classmethod
    def from_dict(cls, mapping: dict[str, int], source: str = "vocabulary") -> Vocabulary:
        """From a word -> index dict: ours, the authors' word2idx files, or NCT's ``<NULL>/<START>`` format."""
        if not isinstance(mapping, dict) or not all(isinstance(v, int) for v in mapping.values()):
            raise ProCapError(f"{source} must be a JSON object from word to integer index.")
        ordered = sorted(mapping, key=mapping.__getitem__)
        if "<NULL>" in mapping:
            return cls(w for w in ordered if w not in _NCT_SPECIALS)
        if ordered[: len(SPECIALS)] != list(SPECIALS) or sorted(mapping.values()) != list(range(len(mapping))):
            raise ProCapError(f"{source} must start with {', '.join(SPECIALS)} at indices 0..7 and be contiguous.")
        return cls(ordered[len(SPECIALS) :])

    def save(self, path: str | os.PathLike) -> None:
        atomic_write_json(path, self.to_dict(), indent=0)

    @classmethod
    def load(cls, path: str | os.PathLike) -> Vocabulary:
        return cls.from_dict(read_json(path, "vocabulary file"), f"vocabulary file {path}")
