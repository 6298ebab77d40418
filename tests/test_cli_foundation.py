"""The foundation subcommands through the real entry point: output, exit codes, one-sentence errors."""

import json

import pytest

from procap.cli import main
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
    assert json.loads((tmp_path / "a" / "b" / "m.json").read_text())["ROUGE_L"] > 0.9


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
