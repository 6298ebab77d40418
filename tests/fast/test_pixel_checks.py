"""procap.fast: NaN / Inf / 0-255 float pixels are refused with one sentence instead of captioning garbage."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from procap.core.errors import ProCapError
from procap.fast import Captioner
from procap.fast.inputs import check_pixels, to_image_tensor
from tests.support import IdVocab


@pytest.fixture(params=[None, "cuda"], ids=["cpu-configuration", "cuda-configuration"])
def captioner(trained, request):
    # "cuda": the GPU's whole-pipeline path (pixel statistics inside the would-be graph), run on the CPU.
    return Captioner(trained[0], IdVocab(), device="cpu", dtype="fp32", max_len=6, configure_as=request.param)


def _bad(kind: str, shape=(3, 32, 32)) -> torch.Tensor:
    image = torch.rand(*shape)
    if kind == "nan":
        image[0, 1, 2] = float("nan")
    elif kind == "inf":
        image[..., -1] = float("inf")
    elif kind == "0-255":
        image = image * 255
    elif kind == "negative":
        image = image - 0.5  # e.g. ImageNet-normalised input
    return image


@pytest.mark.parametrize(
    "kind,message", [("nan", "NaN"), ("inf", "NaN or infinite"), ("0-255", "divide 0-255"), ("negative", r"\[0, 1\]")]
)
def test_every_entry_point_refuses_bad_pixels(captioner, kind, message):
    good = torch.rand(3, 32, 32)
    bad = _bad(kind)
    with pytest.raises(ProCapError, match=message):
        captioner([bad], [good])  # a list of float tensors
    with pytest.raises(ProCapError, match=message):
        captioner(bad[None], good[None])  # one batched tensor
    with pytest.raises(ProCapError, match=message):
        captioner.generate(good[None], bad[None])  # the tensor API
    with pytest.raises(ProCapError, match=message):
        captioner.caption(bad.permute(1, 2, 0).numpy(), good)  # a float numpy image


def test_good_pixels_pass_and_edges_are_inclusive(captioner):
    edges = torch.zeros(2, 3, 32, 32)
    edges[1] = 1.0
    check_pixels(edges)
    assert len(captioner(edges, edges)) == 2
    check_pixels(torch.zeros(2, 3, 32, 32, dtype=torch.uint8) + 255)  # uint8 is converted, never range-checked


def test_a_float_pil_image_is_one_sentence():
    with pytest.raises(ProCapError, match="mode F"):
        to_image_tensor(Image.fromarray(np.zeros((8, 8), np.float32)), 8)


@pytest.mark.parametrize(
    "empty",
    [
        Image.new("RGB", (0, 0)),
        Image.new("RGB", (5, 0)),
        np.zeros((0, 0, 3), np.uint8),
        torch.zeros(0, 7, 3, dtype=torch.uint8),
        torch.zeros(3, 0, 0),
    ],
    ids=["PIL 0x0", "PIL 5x0", "numpy", "uint8 tensor", "float tensor"],
)
def test_an_image_without_pixels_is_refused(empty):
    """An image without pixels (0 x 0) is refused with one sentence."""
    with pytest.raises(ProCapError, match="needs at least one pixel"):
        to_image_tensor(empty, 32)


def test_one_rule_for_uint8_whatever_the_container(captioner):
    """uint8 is 0-255 everywhere: batched tensors given to generate, HWC / CHW tensors, numpy, PIL, all agree with
    the same pixels as floats in [0, 1] (was: generate took uint8 batches as 0-255 'floats' and captioned garbage)."""
    generator = torch.Generator().manual_seed(3)
    pixels = torch.randint(0, 256, (2, 3, 32, 32), dtype=torch.uint8, generator=generator)
    as_float = pixels.float() / 255
    expected = captioner.generate(as_float, as_float.flip(0))
    assert torch.equal(captioner.generate(pixels, pixels.flip(0)), expected)
    hwc = pixels.permute(0, 2, 3, 1)
    for kind in (list(pixels), list(hwc), [p.numpy() for p in hwc], [Image.fromarray(p.numpy()) for p in hwc]):
        assert torch.equal(captioner.images(kind), as_float), type(kind[0])
    assert torch.equal(captioner.images(pixels), as_float)
    with pytest.raises(ProCapError, match="uint8 .0-255. or float"):
        captioner.generate(pixels.long(), pixels.long())


def test_imagine_takes_files_and_pil_images(tmp_path):
    """visualize.imagine given paths failed with an AttributeError; it now loads them as the Captioner does."""
    from procap.model.procap import ProCap
    from procap.viz.figures import imagine
    from tests.support import small_config

    torch.manual_seed(0)
    model = ProCap(small_config()).eval()
    generator = torch.Generator().manual_seed(4)
    arrays = [torch.randint(0, 256, (16, 16, 3), dtype=torch.uint8, generator=generator).numpy() for _ in range(2)]
    paths = [tmp_path / "before.png", tmp_path / "after.png"]
    for array, path in zip(arrays, paths):
        Image.fromarray(array).save(path)
    from_tensors = imagine(model, *(torch.from_numpy(a).permute(2, 0, 1).float() / 255 for a in arrays))
    for given in (paths, [str(p) for p in paths], [Image.fromarray(a) for a in arrays], arrays):
        assert torch.equal(imagine(model, *given).codes, from_tensors.codes)


@pytest.mark.parametrize("capture_memory", [True, False], ids=["static", "eager"])
def test_pixel_statistics_are_read_once_after_the_work(trained, monkeypatch, capture_memory):
    # The check is computed on the device with the work (inside the whole-pipeline graph on CUDA) and read once at
    # the end, so it never stalls the GPU before the work is queued.
    from procap.fast import captioner as captioner_module
    from procap.fast.bucket import Bucket

    captioner = Captioner(
        trained[0], IdVocab(), device="cpu", max_len=4, batch_sizes=(4,), capture_memory=capture_memory
    )
    events: list[str] = []
    real_step, real_raise = Bucket.step, captioner_module._raise_for_bad_pixels
    monkeypatch.setattr(Bucket, "step", lambda self: (events.append("step"), real_step(self))[1])
    monkeypatch.setattr(
        captioner_module, "_raise_for_bad_pixels", lambda stats: (events.append("read"), real_raise(stats))[1]
    )
    bad = torch.rand(3, 3, 32, 32)
    bad[1, 0, 0, 0] = float("nan")
    with pytest.raises(ProCapError, match="before images hold NaN"):
        captioner.generate(bad, torch.rand(3, 3, 32, 32))
    assert events == ["step"] * 3 + ["read"]
    # The bucket's padding rows never keep a former batch's pixels: a good batch of 1 passes after the bad one.
    assert captioner.generate(torch.rand(1, 3, 32, 32), torch.rand(1, 3, 32, 32)).shape == (1, 3)
