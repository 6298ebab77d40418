"""procap.core.validate: the checks every command makes before it starts (one sentence naming the file or argument)."""

from __future__ import annotations

import os

import pytest

from procap.core import validate
from procap.core.errors import ProCapError


def test_input_paths(tmp_path):
    (tmp_path / "f.txt").write_text("x")
    assert validate.input_file(tmp_path / "f.txt", "--pred") == tmp_path / "f.txt"
    with pytest.raises(ProCapError, match="--pred .* is a directory, not a file"):
        validate.input_file(tmp_path, "--pred")
    with pytest.raises(ProCapError, match="--pred .*nope does not exist"):
        validate.input_file(tmp_path / "nope", "--pred")
    with pytest.raises(ProCapError, match="--root .*f.txt is a file, not a folder"):
        validate.input_dir(tmp_path / "f.txt", "--root")


def test_output_paths_are_checked_without_creating_anything(tmp_path):
    (tmp_path / "f.txt").write_text("x")
    validate.output_file(tmp_path / "new" / "deeper" / "out.json", "--out")  # missing parents are fine
    validate.output_dir(tmp_path / "new" / "run", "--out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.txt"]
    with pytest.raises(ProCapError, match="is a directory; give the name of a file"):
        validate.output_file(tmp_path, "--out")
    with pytest.raises(ProCapError, match="f.txt is a file, not a folder"):
        validate.output_file(tmp_path / "f.txt" / "out.json", "--out")
    with pytest.raises(ProCapError, match="is an existing file, not a folder"):
        validate.output_dir(tmp_path / "f.txt", "--out")


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root may write into read-only folders")
def test_a_read_only_folder_is_reported(tmp_path):
    locked = tmp_path / "ro"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        with pytest.raises(ProCapError, match="not writable"):
            validate.output_file(locked / "out.json", "--out")
        with pytest.raises(ProCapError, match="not a writable folder"):
            validate.output_dir(locked, "--out")
    finally:
        locked.chmod(0o700)


@pytest.mark.parametrize(
    "value,bounds,message",
    [
        (0, {"minimum": 1}, "--n must be at least 1, got 0"),
        (-1.0, {"above": 0}, "--n must be greater than 0, got -1.0"),
        (5.0, {"minimum": 0, "maximum": 1}, "--n must be at most 1, got 5.0"),
        (float("nan"), {"minimum": 0}, "--n must be a finite number, got nan"),
        (float("inf"), {}, "--n must be a finite number"),
        ("ten", {"minimum": 1}, "--n must be a number, got 'ten'"),  # a config file's value: compared, a traceback
        ([1, 2], {"above": 0}, r"--n must be a number, got \[1, 2\]"),
        (True, {"minimum": 0}, "--n must be a number, got True"),
    ],
)
def test_numbers_out_of_range(value, bounds, message):
    with pytest.raises(ProCapError, match=message):
        validate.number(value, "--n", **bounds)


def test_numbers_in_range_and_absent_pass():
    validate.number(None, "--n", minimum=1)
    validate.number(1, "--n", minimum=1, maximum=1)
    validate.number(0.5, "--n", above=0, maximum=1)


def test_devices():
    import torch

    assert validate.device("cpu") == torch.device("cpu")
    assert validate.device(None).type in ("cpu", "cuda") and validate.device("auto").type in ("cpu", "cuda")
    with pytest.raises(ProCapError, match="--device 'bogus' is not a device name"):
        validate.device("bogus")
    with pytest.raises(ProCapError, match="--device cuda:99"):
        validate.device("cuda:99")
    if not torch.cuda.is_available():
        with pytest.raises(ProCapError, match="no CUDA device is available"):
            validate.device("cuda")


@pytest.mark.parametrize(
    ("requested", "actual", "same"),
    [
        ("cuda", "cuda:0", True),  # no index: the current device (0 here, or on a one-GPU machine)
        ("cuda:0", "cuda", True),
        ("cuda:0", "cuda:0", True),
        ("cuda:1", "cuda:0", False),
        ("cuda", "cuda:1", False),
        ("cpu", "cpu", True),
        ("cpu:0", "cpu", True),
        ("cpu", "cuda:0", False),
        ("cuda", "cpu", False),
        ("meta", "cpu", False),
    ],
)
def test_same_device_without_a_gpu(requested, actual, same):
    import torch

    if torch.cuda.is_available() and torch.cuda.current_device() != 0:
        pytest.skip("the table assumes CUDA device 0 is current")
    assert validate.same_device(torch.device(requested), torch.device(actual)) is same
    assert validate.same_device(requested, actual) is same  # names work as well as torch.device objects


def test_same_device_follows_the_current_cuda_device(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert validate.same_device("cuda", "cuda:1") and not validate.same_device("cuda", "cuda:0")
    assert validate.device_index("cuda") == 1 and validate.device_index("cuda:0") == 0
    assert validate.device_index("cpu:3") is None


def test_a_read_only_folder_is_reported_whoever_runs(tmp_path, monkeypatch):
    """As root, chmod cannot make a folder read-only, so os.access stands in for a read-only mount."""
    (tmp_path / "ro").mkdir()
    monkeypatch.setattr(validate.os, "access", lambda path, mode: False)
    with pytest.raises(ProCapError, match=r"--out .*out.json cannot be written: folder .*ro is not writable"):
        validate.output_file(tmp_path / "ro" / "out.json", "--out")
    with pytest.raises(ProCapError, match="--out .*ro is not a writable folder"):
        validate.output_dir(tmp_path / "ro", "--out")


def test_a_refused_write_names_the_output_not_the_temporary_file(tmp_path, monkeypatch, capsys):
    """A folder the checks cannot see is read-only (root on a read-only mount, /sys) fails when the temporary
    file is made; the one sentence names --out's file and nothing is left behind."""
    import json
    import tempfile

    from procap.commands.cli import main

    (tmp_path / "pred.json").write_text(json.dumps([{"image_id": "a", "caption": "the cube moved"}]))
    (tmp_path / "refs.json").write_text(json.dumps({"a": ["the cube moved"]}))

    def refuse(prefix: str = "", suffix: str = "", dir: str | None = None):
        raise PermissionError(13, "Permission denied", os.path.join(dir or ".", f"{prefix}abc{suffix}"))

    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    out = tmp_path / "scores.json"
    argv = ["score", "--pred", str(tmp_path / "pred.json"), "--refs", str(tmp_path / "refs.json"), "--out", str(out)]
    assert main([*argv, "--metrics", "bleu"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"procap: error: cannot write {out} (Permission denied)."
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pred.json", "refs.json"]


def test_cpu_with_an_index_is_the_cpu(tmp_path, capsys):
    """``--device cpu:0`` named the CPU but compared unequal to the ``cpu`` of every tensor: caption ended in a
    ValueError traceback from the fast decoder."""
    import torch
    from PIL import Image

    from procap.commands.cli import main
    from procap.data.vocab import Vocabulary
    from procap.loading.checkpoint import save_checkpoint
    from tests.support import micro_model

    assert validate.device("cpu:0") == torch.device("cpu") == validate.canonical_device("cpu:0")
    vocab = Vocabulary(["the", "cube", "moved"])
    ckpt = save_checkpoint(tmp_path / "m.safetensors", micro_model(len(vocab)), vocab)
    for name, color in (("b.png", (0, 0, 0)), ("a.png", (255, 0, 0))):
        Image.new("RGB", (16, 16), color).save(tmp_path / name)
    argv = ["caption", "--ckpt", str(ckpt), str(tmp_path / "b.png"), str(tmp_path / "a.png")]
    assert main([*argv, "--device", "cpu:0"]) == 0
    assert "Traceback" not in capsys.readouterr().err
