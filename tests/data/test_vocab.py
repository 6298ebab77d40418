import json

import pytest

from procap.core.errors import ProCapError
from procap.data import SPECIALS, Vocabulary, tokenize


def test_tokenize_is_ptb_style():
    assert tokenize("The small RED cube isn't there.") == ["the", "small", "red", "cube", "is", "n't", "there"]
    assert tokenize("gonna move it's 2.5 px, ok?") == ["gon", "na", "move", "it", "'s", "2.5", "px", "ok"]
    assert tokenize("") == []


def test_build_respects_min_count_and_specials_come_first():
    vocab = Vocabulary.build(["a red cube", "a blue cube", "a cube"], min_count=2)
    assert vocab.itos[:8] == list(SPECIALS)
    assert set(vocab.itos[8:]) == {"a", "cube"}
    assert (vocab.pad_id, vocab.bos_id, vocab.eos_id, vocab.unk_id, vocab.mask_id) == (0, 4, 5, 6, 7)


def test_encode_decode_round_trip_and_fixed_length():
    vocab = Vocabulary.build(["the red cube moved"])
    ids = vocab.encode("The red cube moved!", max_len=8)
    assert len(ids) == 8 and ids[0] == vocab.bos_id and ids[5] == vocab.eos_id and ids[6:] == [0, 0]
    assert vocab.decode(ids) == "the red cube moved"
    assert vocab.encode("the green cube", max_len=6)[2] == vocab.unk_id
    long = vocab.encode(" ".join(["red"] * 40), max_len=24)
    assert len(long) == 24 and long[-1] == vocab.eos_id


def test_save_load_round_trip(tmp_path):
    vocab = Vocabulary.build(["the red cube moved", "a sphere"])
    vocab.save(tmp_path / "v.json")
    assert Vocabulary.load(tmp_path / "v.json") == vocab


def test_reads_authors_word2idx_and_nct_formats(tmp_path):
    authors = {name: i for i, name in enumerate([*SPECIALS, "a", "cube"])}
    (tmp_path / "word2idx.json").write_text(json.dumps(authors))
    assert Vocabulary.load(tmp_path / "word2idx.json").itos[8:] == ["a", "cube"]
    nct = {"<NULL>": 0, "<UNK>": 1, "<START>": 2, "<END>": 3, "a": 4, "cube": 5}
    (tmp_path / "nct.json").write_text(json.dumps(nct))
    assert Vocabulary.load(tmp_path / "nct.json").itos[8:] == ["a", "cube"]


def test_bad_vocabulary_file(tmp_path):
    (tmp_path / "bad.json").write_text(json.dumps({"a": 0, "b": 1}))
    with pytest.raises(ProCapError, match="bad.json"):
        Vocabulary.load(tmp_path / "bad.json")
