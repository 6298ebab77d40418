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


def test_one_caption_length_check_at_every_entry():
    """max_len is checked by validate.caption_length alone: the decoders' caches, ProCap.generate, the Captioner and
    the vocabulary say the same sentence with the same exception (the decoder's was a ValueError)."""
    import torch

    from procap.data.vocab import Vocabulary
    from procap.fast import Captioner
    from procap.model.procap import ProCap
    from tests.support import small_config

    model = ProCap(small_config()).eval()
    ceiling = model.config.max_caption_len
    wanted = f"max_len must be at most {ceiling}, got {ceiling + 1}."
    image = torch.rand(1, 3, model.config.image_size, model.config.image_size)
    entries = [
        lambda n: model.decoder.setup_caches(1, n, torch.float32, "cpu"),
        lambda n: model.decoder.generate_cached(torch.zeros(1, 4, model.config.dec_dim), n),
        lambda n: model.generate(image, image, max_len=n),
        lambda n: Captioner(model, Vocabulary(["cube"]), device="cpu", dtype="fp32", max_len=n),
    ]
    for entry in entries:
        with pytest.raises(ProCapError) as caught:
            entry(ceiling + 1)
        assert str(caught.value) == wanted
        with pytest.raises(ProCapError, match="max_len must be at least 2, got 1"):
            entry(1)
    with pytest.raises(ProCapError, match="max_len must be an integer"):
        model.generate(image, image, max_len="8")
    with pytest.raises(ProCapError, match="max_len must be at least 2, got 1"):
        Vocabulary(["cube"]).encode("a cube", max_len=1)
    assert validate.caption_length(None, "--max-len") is None and validate.caption_length(None, "m", 9, 9) == 9


@pytest.mark.parametrize(
    "check,value,message",
    [
        (lambda v: validate.seed(v, "--seed"), -1, "--seed must be at least 0, got -1"),
        (lambda v: validate.seed(v, "--seed"), validate.MAX_SEED + 1, "--seed must be at most 4,294,967,295"),
        (lambda v: validate.seed(v, "--seed", count=3), validate.MAX_SEED - 1, "at most 4,294,967,293"),
        (lambda v: validate.seed(v, "seed"), 1.5, "seed must be an integer"),
        (lambda v: validate.keyframe_count(v, "--num-keyframes"), 16, "--num-keyframes must be at most 15, got 16"),
        (lambda v: validate.keyframe_count(v, "-k", frames=3), 4, "-k must be at most l = 3"),
        (lambda v: validate.keyframe_count(v, "num_keyframes"), -1, "num_keyframes must be at least 0"),
    ],
)
def test_seed_and_keyframe_checks(check, value, message):
    with pytest.raises(ProCapError, match=message):
        check(value)
    assert check(None) is None


def test_training_config_uses_the_same_seed_and_keyframe_ranges():
    from procap.train.config import INTEGER_BOUNDS

    assert (
        INTEGER_BOUNDS["seed"] is validate.SEED_BOUNDS and INTEGER_BOUNDS["num_keyframes"] is validate.KEYFRAME_BOUNDS
    )
