"""`procap caption` over many pairs: --pairs lists, --before-dir / --after-dir, --out streaming and --resume."""

from __future__ import annotations

import csv
import json
import os

import pytest

from procap.fast import Captioner
from tests.support import CAPTION_PAIRS, run_caption


@pytest.fixture()
def calls(monkeypatch):
    """The before images of every batch the Captioner is asked to caption."""
    seen: list[list[str]] = []
    caption = Captioner.__call__

    def recording(self, befores, afters):
        seen.append([os.path.basename(path) for path in befores])
        return caption(self, befores, afters)

    monkeypatch.setattr(Captioner, "__call__", recording)
    return seen


def _rows(path) -> list[dict]:
    if path.suffix == ".csv":
        with open(path, newline="") as handle:
            return list(csv.DictReader(handle))
    return [json.loads(line) for line in path.read_text().splitlines()]


def _expected(checkpoint, before_dir, after_dir) -> list[dict]:
    """What a plain Captioner says of every pair, in name order, with the absolute paths as the pair id."""
    captioner = Captioner.from_checkpoint(checkpoint, device="cpu")
    names = [f"pair{index}.png" for index in range(CAPTION_PAIRS)]
    befores, afters = [str(before_dir / n) for n in names], [str(after_dir / n) for n in names]
    return [{"before": b, "after": a, "caption": c} for b, a, c in zip(befores, afters, captioner(befores, afters))]


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_a_list_is_captioned_into_a_file(checkpoint, folders, tmp_path, suffix, calls):
    before_dir, after_dir = folders
    # paths relative to the list's own folder: the command runs from elsewhere
    listing = tmp_path / "lists" / f"pairs{suffix}"
    listing.parent.mkdir()
    entries = [(f"../before/pair{i}.png", f"../after/pair{i}.png") for i in range(CAPTION_PAIRS)]
    if suffix == ".csv":
        listing.write_text("after,before\n" + "".join(f"{a},{b}\n" for b, a in entries))
    else:
        listing.write_text("".join(json.dumps({"before": b, "after": a}) + "\n" for b, a in entries))
    out = tmp_path / "out" / f"captions{suffix}"
    assert run_caption(checkpoint, "--pairs", str(listing), "--out", str(out)) == 0
    assert [len(batch) for batch in calls] == [2, 2, 1]
    assert _rows(out) == _expected(checkpoint, before_dir.resolve(), after_dir.resolve())


def test_folders_are_paired_by_name(checkpoint, folders, tmp_path, capsys):
    before_dir, after_dir = folders
    (before_dir / "notes.txt").write_text("not an image: ignored")
    out = tmp_path / "captions.jsonl"
    assert (
        run_caption(checkpoint, "--before-dir", str(before_dir), "--after-dir", str(after_dir), "--out", str(out)) == 0
    )
    assert _rows(out) == _expected(checkpoint, before_dir, after_dir)
    assert "5 captions written" in capsys.readouterr().err


def test_an_unmatched_name_is_one_sentence(checkpoint, folders, tmp_path, capsys):
    before_dir, after_dir = folders
    (after_dir / "pair3.png").rename(after_dir / "extra.png")
    out = tmp_path / "captions.jsonl"
    assert (
        run_caption(checkpoint, "--before-dir", str(before_dir), "--after-dir", str(after_dir), "--out", str(out)) == 2
    )
    err = capsys.readouterr().err
    assert err.startswith("procap: error:") and err.count("\n") == 1
    assert "only in --before-dir" in err and "pair3.png" in err and "only in --after-dir" in err and "extra.png" in err
    assert not out.exists()


@pytest.mark.parametrize("suffix", [".jsonl", ".csv"])
def test_resume_captions_only_the_rest_and_ends_as_a_full_run(checkpoint, folders, tmp_path, suffix, calls):
    before_dir, after_dir = folders
    source = ["--before-dir", str(before_dir), "--after-dir", str(after_dir)]
    full = tmp_path / f"full{suffix}"
    assert run_caption(checkpoint, *source, "--out", str(full)) == 0
    calls.clear()

    # a run stopped after two pairs, in the middle of writing the third line
    lines = full.read_bytes().splitlines(keepends=True)
    whole = 3 if suffix == ".csv" else 2  # the CSV header is a line too
    partial = tmp_path / f"partial{suffix}"
    partial.write_bytes(b"".join(lines[:whole]) + lines[whole][:10])
    assert run_caption(checkpoint, *source, "--out", str(partial), "--resume") == 0
    assert calls == [["pair2.png", "pair3.png"], ["pair4.png"]]
    assert partial.read_bytes() == full.read_bytes()

    calls.clear()  # all there: nothing to caption
    assert run_caption(checkpoint, *source, "--out", str(partial), "--resume") == 0
    assert calls == [] and partial.read_bytes() == full.read_bytes()


def test_an_existing_output_needs_resume_or_overwrite(checkpoint, folders, tmp_path, capsys, calls):
    before_dir, after_dir = folders
    source = ["--before-dir", str(before_dir), "--after-dir", str(after_dir)]
    out = tmp_path / "captions.jsonl"
    out.write_text("earlier work\n")
    assert run_caption(checkpoint, *source, "--out", str(out)) == 2
    err = capsys.readouterr().err
    assert err.startswith("procap: error:") and "--resume" in err and "--overwrite" in err
    assert out.read_text() == "earlier work\n" and calls == []

    assert run_caption(checkpoint, *source, "--out", str(out), "--resume") == 2  # not a caption file: kept as it is
    assert "not a caption file" in capsys.readouterr().err and out.read_text() == "earlier work\n"

    assert run_caption(checkpoint, *source, "--out", str(out), "--overwrite") == 0
    assert _rows(out) == _expected(checkpoint, before_dir, after_dir)


@pytest.mark.parametrize("progress", [None, "--no-progress"])
def test_progress_bar_on_stderr_unless_turned_off(checkpoint, folders, tmp_path, capsys, progress):
    before_dir, after_dir = folders
    flags = [progress] if progress else []
    out = tmp_path / "captions.csv"
    assert (
        run_caption(
            checkpoint, "--before-dir", str(before_dir), "--after-dir", str(after_dir), "--out", str(out), *flags
        )
        == 0
    )
    err = capsys.readouterr().err
    assert ("5/5" in err) == (progress is None)


@pytest.mark.parametrize(
    "content,message",
    [
        ("before,after\nbefore/pair0.png,after/nope.png\n", "line 2: after image"),
        ("first,second\nbefore/pair0.png,after/pair0.png\n", "no before or after column"),
        ("before,after\nbefore/pair0.png,after/pair0.png\nbefore/pair0.png,after/pair0.png\n", "again"),
        ("before,after\n", "lists no image pairs"),
    ],
)
def test_a_bad_list_is_one_sentence_and_writes_nothing(checkpoint, folders, tmp_path, capsys, content, message):
    listing = tmp_path / "pairs.csv"
    listing.write_text(content)
    out = tmp_path / "captions.jsonl"
    assert run_caption(checkpoint, "--pairs", str(listing), "--out", str(out)) == 2
    err = capsys.readouterr().err
    assert err.startswith("procap: error:") and str(listing) in err and message in err
    assert not out.exists()


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--pairs", "{list}", "{bef}", "{aft}"], "not from IMAGE arguments and --pairs"),
        (["--before-dir", "{before}"], "go together"),
        (["--pairs", "{list}", "--out", "{tmp}/captions.txt"], "must end in .jsonl or .csv"),
        (["--pairs", "{list}", "--out", "{tmp}/c.jsonl", "--resume", "--overwrite"], "give one"),
        (["--pairs", "{list}", "--resume"], "applies to an --out file"),
        (["--pairs", "{tmp}/pairs.txt"], "must be a .csv or .jsonl file"),
    ],
)
def test_bad_arguments_are_one_sentence(checkpoint, folders, tmp_path, capsys, argv, message):
    before_dir, after_dir = folders
    (tmp_path / "pairs.csv").write_text("before,after\nbefore/pair0.png,after/pair0.png\n")
    (tmp_path / "pairs.txt").write_text("before,after\n")
    names = {
        "list": tmp_path / "pairs.csv",
        "bef": before_dir / "pair0.png",
        "aft": after_dir / "pair0.png",
        "before": before_dir,
        "tmp": tmp_path,
    }
    assert run_caption(checkpoint, *[part.format(**names) for part in argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("procap: error:") and message in err


def test_only_the_core_install_is_needed(checkpoint, folders, tmp_path):
    """Captioning a folder needs none of the extras: each of their packages made unimportable first."""
    import subprocess
    import sys

    from procap.core.extras import EXTRA_OF_MODULE

    before_dir, after_dir = folders
    out = tmp_path / "captions.jsonl"
    argv = ["caption", "--ckpt", str(checkpoint), "--before-dir", str(before_dir), "--after-dir", str(after_dir)]
    argv += ["--out", str(out), "--device", "cpu", "--no-progress"]
    script = (
        "import sys\n"
        f"for name in {sorted(EXTRA_OF_MODULE)!r}:\n"
        "    sys.modules[name] = None  # importing it raises ModuleNotFoundError, as without the extra\n"
        "from procap.commands.cli import main\n"
        f"sys.exit(main({argv!r}))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    result = subprocess.run(
        [sys.executable, "-c", script], check=False, capture_output=True, text=True, env=env, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert _rows(out) == _expected(checkpoint, before_dir, after_dir)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes here")
def test_a_named_pipe_is_written_through_in_one_stream(tmp_path):
    """A pipe is held open across batches: closing it after one would end its reader's input."""
    import threading

    from procap.fast.caption_file import CaptionFile

    pipe = tmp_path / "captions.csv"
    os.mkfifo(pipe)
    read: list[str] = []
    reader = threading.Thread(target=lambda: read.append(pipe.read_text()))
    reader.start()
    output = CaptionFile(pipe)
    output.append([(tmp_path / "a.png", tmp_path / "b.png", "the cube moved")])
    output.append([(tmp_path / "c.png", tmp_path / "d.png", "no change")])
    output.close()
    reader.join(timeout=30)
    lines = ["before,after,caption", f"{tmp_path}/a.png,{tmp_path}/b.png,the cube moved"]
    lines.append(f"{tmp_path}/c.png,{tmp_path}/d.png,no change")
    assert read == ["".join(line + "\n" for line in lines)]
    assert pipe.exists() and not pipe.is_file()  # still the pipe, never replaced by a file


def test_a_failed_append_takes_its_cut_line_back(tmp_path, monkeypatch):
    """The disk fills while a batch is written: the file keeps its whole lines only, and the error names it."""
    import errno

    from procap.core.files import OutputError
    from procap.fast import caption_file

    out = tmp_path / "captions.jsonl"
    output = caption_file.CaptionFile(out)
    output.append([(tmp_path / "a.png", tmp_path / "b.png", "the cube moved")])
    kept = out.read_bytes()

    def disk_full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(caption_file.os, "fsync", disk_full)
    with pytest.raises(OutputError) as failed:
        output.append([(tmp_path / "c.png", tmp_path / "d.png", "no change")])
    assert failed.value.filename == str(out) and out.read_bytes() == kept
