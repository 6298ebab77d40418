"""The foundation subcommands through the real entry point: output, exit codes, one-sentence errors."""

import errno
import json
import os
import signal
import subprocess
import sys

import pytest
from safetensors import SafetensorError

from procap.commands.cli import main
from procap.core.files import OutputError
from procap.data import Vocabulary


def test_help_lists_the_subcommands(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for command in ("synth", "vocab", "score", "info"):
        assert command in out


def test_synth_then_vocab(tmp_path, capsys):
    assert main(["synth", "--out", str(tmp_path / "syn"), "--scenes", "8", "--size", "24", "--seed", "1"]) == 0
    assert (tmp_path / "syn" / "splits.json").is_file()
    assert (
        main(
            [
                "vocab",
                "--dataset",
                "clevr-change",
                "--root",
                str(tmp_path / "syn"),
                "--out",
                str(tmp_path / "new" / "vocab.json"),  # a missing parent folder is created
            ]
        )
        == 0
    )
    vocab = Vocabulary.load(tmp_path / "new" / "vocab.json")
    assert "cube" in vocab or "sphere" in vocab or "cylinder" in vocab


def test_score_writes_metrics(tmp_path, capsys):
    (tmp_path / "pred.json").write_text(json.dumps([{"image_id": "1", "caption": "the cube moved"}]))
    (tmp_path / "refs.json").write_text(json.dumps({"1": ["the cube moved", "the cube was moved"]}))
    code = main(
        [
            "score",
            "--pred",
            str(tmp_path / "pred.json"),
            "--refs",
            str(tmp_path / "refs.json"),
            "--metrics",
            "bleu,rouge",
            "--out",
            str(tmp_path / "a" / "b" / "m.json"),  # missing parent folders are created
        ]
    )
    assert code == 0
    assert json.loads((tmp_path / "a" / "b" / "m.json").read_text())["ROUGE-L"] > 90


@pytest.mark.parametrize(
    "argv,needle",
    [
        (
            ["vocab", "--dataset", "spot-the-diff", "--root", "/nonexistent/spot", "--out", "v.json"],
            "/nonexistent/spot",
        ),
        (["info", "no-such-preset"], "unknown preset"),
    ],
)
def test_errors_are_one_sentence_with_exit_code_2(argv, needle, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("procap: error:") and needle in err and "\n" not in err


def test_malformed_prediction_file(tmp_path, capsys):
    (tmp_path / "pred.json").write_text("[1, 2")
    (tmp_path / "refs.json").write_text("{}")
    assert main(["score", "--pred", str(tmp_path / "pred.json"), "--refs", str(tmp_path / "refs.json")]) == 2
    assert "pred.json" in capsys.readouterr().err


def test_a_closed_stdout_ends_quietly():
    """`procap info tiny | head -0`: the reader is gone before the output; no BrokenPipeError traceback, and the
    exit status of a tool stopped by SIGPIPE (141), as `yes | head` gives."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        command = [sys.executable, "-m", "procap", "info", "tiny"]
        done = subprocess.run(command, stdout=write_end, stderr=subprocess.PIPE, timeout=120, check=False)
    finally:
        os.close(write_end)
    assert done.stderr.decode() == "" and done.returncode == 128 + signal.SIGPIPE


@pytest.mark.parametrize(
    "failure, sentence",
    [
        (OSError(errno.ENOSPC, "No space left on device"), "procap vocab could not finish writing --out {out}"),
        (SafetensorError("I/O error: No space left on device (os error 28)"), "could not finish writing --out {out}"),
        (OutputError(errno.ENOSPC, "No space left on device", "x/last.safetensors"), "cannot write x/last.safetensors"),
        (BrokenPipeError(errno.EPIPE, "Broken pipe"), "procap vocab could not finish writing --out {out}"),
    ],
    ids=["plain OSError", "safetensors", "named output", "a pipe other than stdout"],
)
def test_os_failures_without_a_file_name_are_one_sentence(tmp_path, monkeypatch, capsys, failure, sentence):
    """An OSError without a file name (or a library's own error carrying an errno) used to be re-raised as a
    traceback; now it is one sentence naming the output, exit code 2."""
    import procap.commands.vocab

    def broken(args):
        raise failure

    monkeypatch.setattr(procap.commands.vocab, "run", broken)
    out = tmp_path / "v.json"
    assert main(["vocab", "--dataset", "clevr-change", "--root", str(tmp_path / "d"), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("procap: error: ") and sentence.format(out=out) in err and err.count("\n") == 1


@pytest.mark.parametrize("number", [errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS], ids=errno.errorcode.get)
def test_every_refusal_of_a_write_is_the_one_sentence_of_an_output_that_cannot_be_written(
    tmp_path, monkeypatch, capsys, number
):
    """A write refused outside procap.core.files.writing (an OSError naming its file) is said as the output it is,
    whatever the reason: a read-only file system or a quota read 'cannot access', a full disk 'cannot write'."""
    import procap.commands.vocab

    def refused(args):
        raise OSError(number, os.strerror(number), str(tmp_path / "v.json"))

    monkeypatch.setattr(procap.commands.vocab, "run", refused)
    out = tmp_path / "v.json"
    assert main(["vocab", "--dataset", "clevr-change", "--root", str(tmp_path / "d"), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == f"procap: error: cannot write {out} ({os.strerror(number)}).\n"
