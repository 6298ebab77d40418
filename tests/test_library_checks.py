"""The library checks its own inputs: every bad argument, environment variable or lower-level failure reaches a
Python caller as one :class:`ProCapError` sentence naming what was wrong, as the CLI prints it (issue 39, class C).

One table; each case is a call and the word its sentence must name. The same inputs through the command line are
in ``tests/commands/test_cli_bad_inputs.py``.
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from PIL import Image
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from procap.core.errors import ProCapError
from procap.core.json_files import parse_json
from procap.data import Vocabulary
from procap.eval.metrics import score
from procap.experiments.demo import run_demo
from procap.fast import Captioner
from procap.kernels.attention import select_backend
from procap.loading.checkpoint import load_checkpoint, save_checkpoint
from procap.model.procap import ProCap
from procap.train.config import TrainConfig
from procap.train.distributed import env_context, launched_by_torchrun
from procap.train.loop import total_steps
from tests.support import small_config

NO_CUDA = not torch.cuda.is_available()


@dataclass(frozen=True)
class Bad:
    """A call that must raise one ProCapError sentence holding ``needle``; ``env`` is set around it."""

    name: str
    call: Callable[[dict[str, Any]], Any]
    needle: str
    env: tuple[tuple[str, str], ...] = ()
    needs_no_cuda: bool = False


@pytest.fixture(scope="module")
def things(tmp_path_factory) -> dict[str, Any]:
    """A small checkpoint, the same weights stored as float8, its model and vocabulary, a truncated PNG."""
    root = tmp_path_factory.mktemp("library_checks")
    vocab = Vocabulary.build(["the cube moved", "a sphere appeared"], 1)
    torch.manual_seed(0)
    model = ProCap(small_config(vocab_size=len(vocab))).eval()
    ckpt = root / "model.safetensors"
    save_checkpoint(ckpt, model, vocab)
    with safe_open(str(ckpt), framework="pt") as handle:
        metadata = handle.metadata()
    float8 = root / "float8.safetensors"
    tensors = load_file(ckpt)
    save_file(
        {k: v.to(torch.float8_e4m3fn) if v.is_floating_point() else v for k, v in tensors.items()},
        float8,
        metadata=metadata,
    )
    png = io.BytesIO()
    Image.new("RGB", (32, 32), (10, 200, 30)).save(png, format="PNG")
    truncated = root / "truncated.png"
    truncated.write_bytes(png.getvalue()[: len(png.getvalue()) // 2])
    return {"ckpt": ckpt, "float8": float8, "model": model, "vocab": vocab, "truncated": truncated, "root": root}


def _captioner(t: dict[str, Any], **kwargs: Any) -> Captioner:
    return Captioner(t["model"], t["vocab"], device="cpu", **kwargs)


def _caption_lazy_truncated_image(t: dict[str, Any]) -> Any:
    captioner = _captioner(t)
    image = Image.open(t["truncated"])  # opened lazily: the pixels are decoded by the Captioner
    return captioner([image], [image])


def _meta(*shape: int) -> torch.Tensor:
    return torch.empty(*shape, device="meta")


def _attention_call(t: dict[str, Any]) -> Any:
    before = torch.rand(1, 3, 16, 16)
    return t["model"].generate(before, before)


CASES = [
    Bad("device without CUDA", lambda t: Captioner.from_checkpoint(t["ckpt"], device="cuda"), "device", (), True),
    Bad("unknown device", lambda t: Captioner.from_checkpoint(t["ckpt"], device="bogus"), "device"),
    Bad("Captioner.to without CUDA", lambda t: _captioner(t).to("cuda"), "device", (), True),
    Bad("integer dtype", lambda t: _captioner(t, dtype=torch.int64), "dtype"),
    Bad("float8 dtype", lambda t: _captioner(t, dtype=torch.float8_e4m3fn), "dtype"),
    Bad("dtype of another type", lambda t: _captioner(t, dtype=5), "dtype"),
    Bad("string max_len", lambda t: _captioner(t, max_len="5"), "max_len"),
    Bad("float max_len", lambda t: _captioner(t, max_len=4.5), "max_len"),
    Bad(
        "string max_len of the model",
        lambda t: t["model"].generate(torch.rand(1, 3, 16, 16), torch.rand(1, 3, 16, 16), max_len="5"),
        "max_len",
    ),
    Bad("unknown strategy", lambda t: _captioner(t, strategy="nucleus"), "strategy"),
    Bad("option of another strategy", lambda t: _captioner(t, strategy="greedy", strategy_options={"seed": 1}), "seed"),
    Bad(
        "sampling option out of range",
        lambda t: _captioner(t, strategy="sample", strategy_options={"top_p": 2}),
        "top_p",
    ),
    Bad("beams beside sampling", lambda t: _captioner(t, strategy="sample", num_beams=2), "num_beams"),
    Bad("string batch size", lambda t: _captioner(t, batch_sizes=["8"]), "batch_sizes"),
    Bad("batch sizes as a number", lambda t: _captioner(t, batch_sizes=8), "batch_sizes"),
    # the bound of the command line's --batch-size: on CUDA each bucket's buffers are taken whole
    Bad("batch size beyond memory", lambda t: _captioner(t, batch_sizes=[1, 10**8]), "batch_sizes 100000000 needs"),
    Bad("map_location", lambda t: load_checkpoint(t["ckpt"], map_location="bogus"), "map_location"),
    Bad(
        "map_location without CUDA", lambda t: load_checkpoint(t["ckpt"], map_location="cuda"), "map_location", (), True
    ),
    Bad("float8 checkpoint", lambda t: load_checkpoint(t["float8"]), "float8_e4m3fn"),
    Bad("float8 checkpoint in the Captioner", lambda t: Captioner.from_checkpoint(t["float8"]), "float8_e4m3fn"),
    Bad("lazily opened truncated image", _caption_lazy_truncated_image, "truncated.png"),
    # a tensor on the meta device has no values: reading one raised NotImplementedError
    Bad("meta-device image", lambda t: _captioner(t).caption(_meta(3, 16, 16), _meta(3, 16, 16)), "meta device"),
    Bad("meta-device batch", lambda t: _captioner(t)(_meta(2, 3, 16, 16), _meta(2, 3, 16, 16)), "meta device"),
    Bad("meta-device generate", lambda t: _captioner(t).generate(_meta(2, 3, 16, 16), _meta(2, 3, 16, 16)), "meta"),
    Bad("no metric", lambda t: score({"p": "a cube"}, {"p": ["a cube"]}, metrics=[]), "metrics"),
    Bad("unknown metric", lambda t: score({"p": "a cube"}, {"p": ["a cube"]}, metrics=["bleu", "nope"]), "nope"),
    Bad(
        "unknown attention backend",
        lambda t: select_backend("cpu", torch.float32),
        "PROCAP_ATTENTION",
        (("PROCAP_ATTENTION", "bogus"),),
    ),
    Bad(
        "flash attention on a CPU",
        lambda t: select_backend("cpu", torch.float32),
        "PROCAP_ATTENTION",
        (("PROCAP_ATTENTION", "flash"),),
    ),
    Bad("flash attention reached by a model", _attention_call, "PROCAP_ATTENTION", (("PROCAP_ATTENTION", "flash"),)),
    Bad("world size not a number", lambda t: launched_by_torchrun(), "WORLD_SIZE", (("WORLD_SIZE", "abc"),)),
    Bad("world size zero", lambda t: launched_by_torchrun(), "WORLD_SIZE", (("WORLD_SIZE", "0"),)),
    Bad(
        "rank not a number", lambda t: env_context(), "RANK", (("WORLD_SIZE", "2"), ("RANK", "x"), ("LOCAL_RANK", "0"))
    ),
    Bad(
        "rank beyond the world",
        lambda t: env_context(),
        "RANK",
        (("WORLD_SIZE", "2"), ("RANK", "2"), ("LOCAL_RANK", "0")),
    ),
    Bad("local rank missing", lambda t: env_context(), "LOCAL_RANK", (("WORLD_SIZE", "2"), ("RANK", "0"))),
    # multipliers of time or memory have documented ceilings in the library, not only on the command line
    Bad("steps beyond the ceiling", lambda t: TrainConfig(steps=10**12), "steps must be at most 10,000,000"),
    Bad("epochs beyond the ceiling", lambda t: TrainConfig(epochs=10**9), "epochs must be at most"),
    Bad("grad_accum beyond the ceiling", lambda t: TrainConfig(grad_accum=10**5), "grad_accum must be at most 1,024"),
    Bad("grad_accum zero", lambda t: TrainConfig(grad_accum=0), "grad_accum must be at least 1"),
    Bad("steps as text", lambda t: TrainConfig(steps="10"), "steps must be an integer"),
    Bad("warmup_steps beyond the ceiling", lambda t: TrainConfig(warmup_steps=10**12), "warmup_steps"),
    Bad("seed beyond the ceiling", lambda t: TrainConfig(seed=2**70), "seed"),
    Bad("num_keyframes beyond the ceiling", lambda t: TrainConfig(num_keyframes=1000), "num_keyframes"),
    Bad("epochs giving too many steps", lambda t: total_steps(TrainConfig(epochs=100_000), 10**4), "--epochs 100000"),
    Bad(
        "demo seeds beyond the ceiling", lambda t: run_demo(t["root"] / "demo", seeds=10**5), "seeds must be at most 64"
    ),
    Bad("demo seeds as text", lambda t: run_demo(t["root"] / "demo", seeds="2"), "seeds must be an integer"),
]


@pytest.mark.parametrize("bad", CASES, ids=[c.name for c in CASES])
def test_bad_library_input_is_one_procap_error(bad: Bad, things, monkeypatch):
    if bad.needs_no_cuda and not NO_CUDA:
        pytest.skip("this machine has CUDA: the call is valid here")
    for variable in ("PROCAP_ATTENTION", "WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(variable, raising=False)
    for variable, value in bad.env:
        monkeypatch.setenv(variable, value)
    with pytest.raises(ProCapError) as caught:
        bad.call(things)
    message = str(caught.value)
    assert bad.needle in message, message
    assert not (things["root"] / "demo").exists()  # refused before anything is written
    assert "\n" not in message and "Traceback" not in message


def test_a_refused_move_leaves_the_captioner_as_it_was(things):
    captioner = _captioner(things)
    with pytest.raises(ProCapError, match="dtype"):
        captioner.to("cpu", dtype=torch.int32)
    assert captioner.device == torch.device("cpu") and captioner.dtype == torch.float32
    assert captioner.caption(torch.rand(3, 16, 16), torch.rand(3, 16, 16)) is not None


def test_valid_environment_values_still_work(monkeypatch):
    monkeypatch.setenv("PROCAP_ATTENTION", "math")
    assert select_backend("cpu", torch.float32) == "math"
    monkeypatch.setenv("PROCAP_ATTENTION", "auto")
    assert select_backend("cpu", torch.float32) != "auto"
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert not launched_by_torchrun()
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    context = env_context()
    assert (context.rank, context.world, context.local_rank) == (1, 2, 1)


def test_one_metric_name_as_a_string_is_one_metric():
    pytest.importorskip("pycocoevalcap")
    results = score({"p": "the cube moved"}, {"p": ["the cube moved"]}, metrics="CIDEr")
    assert set(results) == {"CIDEr"}


# -- valid inputs taken: any os.PathLike where a path is taken (issue 39, class G) --------------------------------
class ForeignPath(os.PathLike):
    """A path object that is not pathlib's, whose ``str`` is a repr naming no file (as many libraries' are)."""

    def __init__(self, path) -> None:
        self.path = os.fspath(path)

    def __fspath__(self) -> str:
        return self.path

    def __repr__(self) -> str:
        return f"<ForeignPath at {id(self):#x}>"

    __str__ = __repr__


def test_any_path_object_is_taken_wherever_a_path_is(things, tmp_path):
    from procap.data.images import ImageCache, load_image
    from procap.eval.metrics import read_references

    image = tmp_path / "image.png"
    Image.new("RGB", (16, 16), (30, 90, 200)).save(image)
    checkpoint = tmp_path / "copy.safetensors"
    save_checkpoint(ForeignPath(checkpoint), things["model"], things["vocab"])
    model, vocab, _ = load_checkpoint(ForeignPath(checkpoint))
    captioner = Captioner.from_checkpoint(ForeignPath(checkpoint), device="cpu")
    assert Captioner.from_pretrained(ForeignPath(checkpoint), device="cpu").vocab == vocab
    by_path = captioner([image], [image])
    assert captioner([ForeignPath(image)], [ForeignPath(image)]) == by_path
    assert [captioner.caption(ForeignPath(image), ForeignPath(image))] == by_path
    assert torch.equal(load_image(ForeignPath(image), 16), ImageCache(16)(ForeignPath(image)))
    vocab.save(ForeignPath(tmp_path / "vocab.json"))
    assert Vocabulary.load(ForeignPath(tmp_path / "vocab.json")) == vocab
    model.save_pretrained(ForeignPath(tmp_path / "pretrained"), vocab=vocab)
    assert isinstance(ProCap.from_pretrained(ForeignPath(tmp_path / "pretrained")), ProCap)
    (tmp_path / "refs.json").write_text('{"p1": ["the cube moved"]}', encoding="utf-8")
    assert read_references(ForeignPath(tmp_path / "refs.json")) == {"p1": ["the cube moved"]}


# -- a safetensors file declaring more than it holds (issue 39 B) ---------------------------------------------------
def _declaring_safetensors(path, shape: list[int], stored: int) -> None:
    """A safetensors file written by hand: its header declares a float32 tensor of ``shape`` over ``stored`` bytes."""
    import json
    import struct

    header = json.dumps({"w": {"dtype": "F32", "shape": shape, "data_offsets": [0, stored]}}).encode()
    header += b" " * (-len(header) % 8)
    path.write_bytes(struct.pack("<Q", len(header)) + header + bytes(stored))


@pytest.mark.parametrize(
    ("shape", "stored"), [([16384, 16384], 4), ([16384, 16384], 0), ([2**40], 8)], ids=["4 bytes", "none", "2**40"]
)
def test_a_safetensors_file_cannot_declare_more_than_it_holds(tmp_path, shape, stored):
    from procap.core.weights import read_header, read_tensors
    from tests.support import PeakMemory

    path = tmp_path / "w.safetensors"
    _declaring_safetensors(path, shape, stored)
    for read in (read_tensors, read_header, load_checkpoint):
        with PeakMemory() as peak, pytest.raises(ProCapError) as caught:
            read(path)
        assert str(path) in str(caught.value) and "\n" not in str(caught.value)
        assert peak.growth < 64 * 2**20, f"{read.__name__} took {peak.growth / 2**20:.0f} MiB at its peak"


# -- messages quote values briefly (issue 48, class E) --------------------------------------------------------------
HUGE = list(range(10**6))
LONG_KEY = "k" * 10**6


@pytest.mark.parametrize(
    ("call", "needle"),
    [
        (lambda t: _captioner(t, batch_sizes=set(HUGE)), "batch_sizes must be a sequence"),
        (lambda t: _captioner(t, batch_sizes=[HUGE]), "each of batch_sizes must be an integer"),
        (lambda t: parse_json(f'{{"{LONG_KEY}": 1, "{LONG_KEY}": 2}}', "j.json"), "names the key 'kkkk"),
    ],
    ids=["batch_sizes not a sequence", "a batch size not an integer", "a long key given twice"],
)
def test_a_message_quotes_a_value_briefly(call, needle, things):
    """A message quoted the whole value: megabytes for a long list, without end for a YAML alias bomb."""
    with pytest.raises(ProCapError) as caught:
        call(things)
    message = str(caught.value)
    assert needle in message and len(message) < 300, message[:300]
