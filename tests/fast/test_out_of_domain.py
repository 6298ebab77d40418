"""Images far from a model's training domain are said once (``OutOfDomainWarning``), by the Captioner and by
``procap caption`` on one stderr line; in-domain images, identical pairs and unknown-domain checkpoints never are."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from PIL import Image

from procap.commands.cli import main
from procap.core.errors import OutOfDomainWarning, ProCapError, ProCapWarning
from procap.data import Vocabulary
from procap.data.domain import TRAINED_ON, domain_record
from procap.fast import Captioner
from procap.loading.checkpoint import save_checkpoint
from procap.model.procap import ProCap
from tests.support import small_config, small_vqgan_config

SYNTHETIC_64 = domain_record(
    dataset="clevr-change",
    synthetic=True,
    data="runs/demo/data",
    image_size=64,
    source_image_size=(64, 64),
    preset="tiny",
)


def _png(path, width: int, height: int, seed: int = 0):
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path)
    return path


def _camera_jpeg(path, size: int = 64):
    exif = Image.Exif()
    exif[0x010F], exif[0x0110] = "Canon", "EOS 5D"
    Image.fromarray(np.full((size, size, 3), 120, dtype=np.uint8)).save(path, exif=exif)
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A 64 px model saved as a synthetic-scene checkpoint and as one without a record, and images to give them."""
    root = tmp_path_factory.mktemp("domain")
    torch.manual_seed(0)
    vocab = Vocabulary.build(["the cube moved", "no change was made"], min_count=1)
    model = ProCap(small_config(image_size=64, vqgan=small_vqgan_config(resolution=64), vocab_size=len(vocab)))
    save_checkpoint(root / "synthetic.safetensors", model, vocab, {"stage": "stage2", TRAINED_ON: SYNTHETIC_64})
    save_checkpoint(root / "unknown.safetensors", model, vocab, {"stage": "stage2"})
    return {
        "root": root,
        "photo": (_png(root / "photo_before.png", 640, 480, 1), _png(root / "photo_after.png", 640, 480, 2)),
        "scene": (_png(root / "before.png", 64, 64, 3), _png(root / "after.png", 64, 64, 4)),
        "camera": _camera_jpeg(root / "camera.jpg"),
    }


def _caught(action) -> list[warnings.WarningMessage]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # every warning given is seen, repeats included
        action()
    return [w for w in caught if issubclass(w.category, ProCapWarning)]


# -- the Captioner and the command -----------------------------------------------------------------------------
def test_a_64px_synthetic_model_given_640x480_photos_warns_once(files):
    captioner = Captioner.from_checkpoint(files["root"] / "synthetic.safetensors", device="cpu")
    assert captioner.domain == SYNTHETIC_64
    before, after = files["photo"]

    def calls():
        captioner.caption(before, after)
        captioner([before, before], [after, after])
        captioner.caption(before, after)

    caught = _caught(calls)
    assert len(caught) == 1 and caught[0].category is OutOfDomainWarning
    message = str(caught[0].message)
    assert "640 x 480 px" in message and "synthetic CLEVR-Change" in message and "64 x 64 px" in message
    assert message.startswith(f"the pair {before} -> {after} (640 x 480 px) is far")  # the first call's one pair
    assert caught[0].filename == __file__  # it points at the caller's line, not into the library


@pytest.mark.parametrize(
    ("empty", "name"),
    [
        (Image.new("RGB", (0, 0)), "PIL image"),
        (np.zeros((0, 0, 3), dtype=np.uint8), "numpy image"),
        (torch.zeros(3, 0, 0), "image tensor"),
        (torch.zeros(0, 0, 3, dtype=torch.uint8), "image tensor"),
    ],
    ids=["pil", "numpy", "float-tensor", "uint8-tensor"],
)
def test_an_image_without_pixels_is_one_sentence_naming_it(files, empty, name):
    """The domain check runs before the images are loaded; a 0 x 0 image raised ZeroDivisionError there."""
    captioner = Captioner.from_checkpoint(files["root"] / "synthetic.safetensors", device="cpu")
    with pytest.raises(ProCapError, match=f"^the {name} is 0 x 0 pixels; an image to caption needs at least one"):
        captioner.caption(files["scene"][0], empty)


def test_in_domain_and_identical_images_do_not_warn(files):
    captioner = Captioner.from_checkpoint(files["root"] / "synthetic.safetensors", device="cpu")
    before, after = files["scene"]
    assert _caught(lambda: captioner.caption(before, after)) == []
    assert _caught(lambda: captioner.caption(before, before)) == []  # identical pairs are legal input
    assert _caught(lambda: captioner(torch.rand(2, 3, 64, 64), torch.rand(2, 3, 64, 64))) == []


def test_an_unknown_domain_never_warns(files):
    captioner = Captioner.from_checkpoint(files["root"] / "unknown.safetensors", device="cpu")
    assert captioner.domain is None
    before, after = files["photo"]
    assert _caught(lambda: captioner.caption(before, after)) == []
    assert _caught(lambda: captioner.caption(files["camera"], files["camera"])) == []


def test_a_camera_photograph_at_the_trained_size_warns(files):
    captioner = Captioner.from_checkpoint(files["root"] / "synthetic.safetensors", device="cpu")
    caught = _caught(lambda: captioner.caption(files["scene"][0], files["camera"]))
    assert len(caught) == 1 and "(taken with a Canon EOS 5D)" in str(caught[0].message)


def test_from_pretrained_carries_the_record(files, tmp_path):
    model = ProCap.from_pretrained(files["root"] / "synthetic.safetensors")
    folder = model.save_pretrained(tmp_path / "pretrained")
    captioner = Captioner.from_pretrained(folder, device="cpu")
    assert captioner.domain == SYNTHETIC_64
    assert len(_caught(lambda: captioner.caption(*files["photo"]))) == 1


def test_caption_says_it_once_on_one_stderr_line(files, capsys):
    ckpt = str(files["root"] / "synthetic.safetensors")
    photos = [str(p) for p in files["photo"]]
    assert main(["caption", "--ckpt", ckpt, "--device", "cpu", *photos, *photos]) == 0
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(captured.out.splitlines()) == 2  # both pairs captioned all the same
    warned = [line for line in lines if line.startswith("procap: warning: ")]
    assert len(warned) == 1 and "640 x 480 px" in warned[0] and len(lines) == 1, captured.err

    scene = [str(p) for p in files["scene"]]
    for checkpoint in (ckpt, str(files["root"] / "unknown.safetensors")):
        images = scene if checkpoint == ckpt else photos
        assert main(["caption", "--ckpt", checkpoint, "--device", "cpu", *images]) == 0
        assert capsys.readouterr().err == "", checkpoint
