"""One reader of pair rows (issue 49, item 6): the pair lists of `procap caption --pairs` and the caption files it
resumes both read CSV / JSON Lines rows through procap.data.pair_lists.read_rows."""

from __future__ import annotations

import pytest

from procap.core.errors import ProCapError
from procap.data.pair_lists import read_pair_list, read_rows
from procap.fast.caption_file import CaptionFile

COLUMNS = ("before", "after", "caption")


@pytest.mark.parametrize(
    "suffix,data",
    [
        (".csv", b'before,after,caption\na.png,b.png,a cube moved\n"c,1.png",d.png,"two\nlines"\n'),
        (
            ".jsonl",
            (
                b'{"before": "a.png", "after": "b.png", "caption": "a cube moved"}\n\n'
                b'{"before": "c,1.png", "after": "d.png", "caption": "two\\nlines"}\n'
            ),
        ),
    ],
)
def test_both_formats_give_the_same_rows(suffix, data):
    rows = read_rows(data, suffix, "test file", COLUMNS)
    assert [row for _, row in rows] == [
        {"before": "a.png", "after": "b.png", "caption": "a cube moved"},
        {"before": "c,1.png", "after": "d.png", "caption": "two\nlines"},
    ]
    assert rows[0][0] == (2 if suffix == ".csv" else 1)  # line numbers as an editor shows them
    assert rows[1][0] == (4 if suffix == ".csv" else 3)


@pytest.mark.parametrize(
    "suffix,data,message",
    [
        (".csv", b"before,caption\na.png,x\n", "has no after column in its header line"),
        (".csv", b"before,after,caption\na.png,b.png,x,extra\n", "line 2 has more fields than its header line"),
        (".csv", b"before,after,caption\na.png,b.png\n", "line 2 gives no caption"),
        (".jsonl", b'{"before": "a.png", "after": "b.png"}\n', "line 1 gives no caption"),
        (".jsonl", b'["a.png", "b.png", "x"]\n', "line 1 is not a JSON object"),
        (".jsonl", b'{"before": "a", "before": "b", "after": "c", "caption": "d"}\n', "names the key 'before' twice"),
        (".jsonl", b"\xff\xfe not text\n", "is not UTF-8 text"),
    ],
)
def test_a_bad_row_is_one_sentence_naming_the_file_and_line(suffix, data, message):
    with pytest.raises(ProCapError, match="test file") as caught:
        read_rows(data, suffix, "test file", COLUMNS)
    assert message in str(caught.value) and str(caught.value).count(". ") == 0


def test_an_empty_file_has_no_rows():
    assert read_rows(b"", ".csv", "f", COLUMNS) == [] and read_rows(b"\n\n", ".jsonl", "f", COLUMNS) == []


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_a_pair_list_and_a_caption_file_refuse_the_same_line_alike(tmp_path, suffix):
    """The same malformed second row: both readers name line and problem the same way (they share the reader)."""
    for name in ("a.png", "b.png"):
        (tmp_path / name).write_bytes(b"")
    if suffix == ".csv":
        text = "before,after,caption\na.png,b.png,x\na.png,b.png,x,extra\n"
    else:
        text = '{"before": "a.png", "after": "b.png", "caption": "x"}\n[1]\n'
    listing, captions = tmp_path / f"pairs{suffix}", tmp_path / f"captions{suffix}"
    listing.write_text(text)
    captions.write_text(text)
    with pytest.raises(ProCapError) as from_list:
        read_pair_list(listing)
    with pytest.raises(ProCapError) as from_captions:
        CaptionFile(captions, resume=True)
    problem = "has more fields than its header line" if suffix == ".csv" else "is not a JSON object"
    line = 3 if suffix == ".csv" else 2
    assert f"{listing} line {line} {problem}" in str(from_list.value)
    assert f"{captions} line {line} {problem}" in str(from_captions.value)
    assert str(from_captions.value).endswith("so it is not a caption file to resume.")


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_a_caption_file_resumes_its_pairs(tmp_path, suffix):
    out = tmp_path / f"captions{suffix}"
    pairs = [(tmp_path / "a.png", tmp_path / "b,1.png"), (tmp_path / "c.png", tmp_path / "d.png")]
    with CaptionFile(out) as file:
        file.append([(*pairs[0], "a cube, moved"), (*pairs[1], "")])
        file.finish()
    with CaptionFile(out, resume=True) as file:
        assert file.done == {(str(before), str(after)) for before, after in pairs}
