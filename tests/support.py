"""Helpers shared by the test suite, imported one way: ``from tests.support import ...``.

Small model configurations, synthetic images and dataset folders, the kernel tests' implementation matrix, and the
authors' reduced-size checkpoint that ``tests/convert`` checks against.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from procap.core.config import VQGANConfig, get_preset
from procap.kernels import _ext
from procap.model.decoder import BOS_ID, EOS_ID, NUM_SPECIALS, PAD_ID, CaptionDecoder

# The one CUDA skip marker. A string condition is evaluated lazily, so collection never initialises CUDA.
requires_cuda = pytest.mark.skipif("not __import__('torch').cuda.is_available()", reason="needs a CUDA GPU")


def parse_stage_args(stage: str, *argv: str) -> argparse.Namespace:
    """``argv`` parsed as a training command's options (``procap.commands.cli_args.add_common_arguments``)."""
    from procap.commands.cli_args import add_common_arguments

    parser = argparse.ArgumentParser()
    add_common_arguments(parser, stage)
    return parser.parse_args(list(argv))


def subprocess_env(**extra: str) -> dict[str, str]:
    """The environment for a child Python process: this checkout first on PYTHONPATH, ahead of what the parent has
    there (a GPU image may keep packages such as pycocoevalcap only on PYTHONPATH), plus ``extra``."""
    root = str(Path(__file__).resolve().parents[1])
    path = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, **extra}


class IdVocab:
    """Stands in for a Vocabulary where only token ids matter: ``decode`` gives the ids as text."""

    def decode(self, ids):
        return " ".join(str(i) for i in ids)


# -- kernels: which implementations can run here, where their inputs live, error measures -------------------------
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _triton_skip() -> str | None:
    try:
        import triton  # noqa: F401
    except ImportError:
        return "triton is not installed"
    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        return "no CUDA and TRITON_INTERPRET is not 1"
    return None


# Tests that run a Triton kernel outside the implementation matrix (inputs on impl_device("triton")).
requires_triton = pytest.mark.skipif(_triton_skip() is not None, reason=str(_triton_skip()))


def _cpp_skip() -> str | None:
    error = _ext.load_error()  # compiled on first use (once per torch, Python and device, then cached)
    if error is not None:
        return f"the compiled ops are not loaded ({error})"
    return None


def _cuda_ext_skip(op: str) -> str | None:
    if not torch.cuda.is_available():
        return "needs a CUDA GPU"
    if not _ext.has_kernel(op, "cuda"):
        return f"the extension was built without a CUDA kernel for {op}"
    return None


def impl_params(ext_op: str, cuda_kernel: bool = True) -> list:
    """pytest params over the implementations of one op, each skipped with its reason when it cannot run.

    ``cuda_kernel=False``: kernels/csrc/cuda has no kernel for the op (Triton serves CUDA), so there is no "cuda" param to
    skip on a GPU machine.
    """
    skips = {"reference": None, "triton": _triton_skip(), "cpp": _cpp_skip()}
    if cuda_kernel:
        skips["cuda"] = _cuda_ext_skip(ext_op)
    return [
        pytest.param(impl, marks=pytest.mark.skipif(reason is not None, reason=reason or ""), id=impl)
        for impl, reason in skips.items()
    ]


def impl_device(impl: str) -> torch.device:
    """Where an implementation's inputs live: the Triton interpreter and the C++ op take CPU tensors."""
    if impl == "cuda" or (impl == "triton" and torch.cuda.is_available()):
        return torch.device("cuda")
    return torch.device("cpu")


def max_abs_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.double() - b.double()).abs().max().item() if a.numel() else 0.0


# -- small models ----------------------------------------------------------------------------------------------
def small_vqgan_config(**overrides) -> VQGANConfig:
    """f4 VQGAN on 16 px images: 4x4 latents; attention at nominal 8 (level 1) and in the mid block."""
    base = {
        "resolution": 16,
        "ch": 32,
        "ch_mult": (1, 1, 2),
        "num_res_blocks": 1,
        "attn_resolutions": (8,),
        "z_channels": 32,
        "embed_dim": 16,
        "n_embed": 64,
    }
    return VQGANConfig(**{**base, **overrides})


def small_config(**overrides):
    """A ProCap config on 16 px images (4x4 grid), k = 1, one-layer 32-wide encoder and decoder."""
    base = {
        "vqgan": small_vqgan_config(),
        "image_size": 16,
        "vocab_size": 20,
        "max_caption_len": 8,
        "num_keyframes": 1,
        "enc_dim": 32,
        "enc_heads": 2,
        "enc_mlp": 64,
        "enc_layers": 1,
        "dec_dim": 32,
        "dec_heads": 2,
        "dec_ffn": 64,
        "dec_layers": 1,
        "dropout": 0.0,
        # the first tiny departures only; the object-naming ones have their own tests (test_object_naming.py)
        "difference_mode": "absolute",
        "token_merge": 1,
        "change_token": False,
        "change_window": 0,
        "change_broadcast": False,
        "change_pixels": False,
        "pixel_cnn": 0,
        "window_glimpse": 0,
        "standardize_features": False,
        "image_encoder": 0,
        "learned_localisation": False,
        "restart_front_end": False,
    }
    return get_preset("tiny", **{**base, **overrides})


def random_captions(batch: int, length: int, vocab: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """(B, L) BOS w... EOS PAD... captions with distinct word sequences per row."""
    words = torch.randint(NUM_SPECIALS, vocab, (batch, length), generator=generator)
    words[:, 0] = BOS_ID
    for b in range(batch):
        end = 2 + (b % (length - 2))
        words[b, end] = EOS_ID
        words[b, end + 1 :] = PAD_ID
    return words


def spread_decoder(vocab: int = 12, max_len: int = 4, seed: int = 3) -> CaptionDecoder:
    """A random decoder whose next-token distributions are far from uniform and change with the prefix
    (a default init gives near-flat logits, where every search agrees): the beam and sampling tests' decoder."""
    torch.manual_seed(seed)
    decoder = CaptionDecoder(small_config(vocab_size=vocab, max_caption_len=max_len)).eval()
    with torch.no_grad():
        for parameter in decoder.parameters():
            if parameter.dim() > 1:
                parameter.normal_(0.0, 0.6)
    return decoder


def memory_for(decoder: CaptionDecoder, batch: int, seed: int = 1) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(batch, decoder.memory_len, decoder.embed.weight.shape[1], generator=generator)


def small_training_config(vocab_size: int, **overrides):
    """:func:`small_config` for the training tests: the dataset's vocabulary and 12-token captions.

    Like :func:`small_config` it keeps only the first ``tiny`` departures: the object-naming ones include a
    BatchNorm, whose batch statistics would make the split-step equality tests (torchrun, --grad-accum) approximate.
    """
    return small_config(**{"vocab_size": vocab_size, "max_caption_len": 12, **overrides})


def micro_model(vocab_size: int):
    """An untrained one-layer, 16-wide ProCap on 16 px images (the ``tiny`` preset's departures kept), for the
    command tests that need a checkpoint and no captions worth reading."""
    from procap.model.procap import ProCap

    vqgan = small_vqgan_config(resolution=16, ch_mult=(1, 2), attn_resolutions=(), embed_dim=8, n_embed=32)
    config = get_preset(
        "tiny",
        vqgan=vqgan,
        image_size=16,
        vocab_size=vocab_size,
        max_caption_len=8,
        num_keyframes=1,
        enc_dim=16,
        enc_heads=2,
        enc_mlp=32,
        enc_layers=1,
        dec_dim=16,
        dec_heads=2,
        dec_ffn=32,
        dec_layers=1,
        dropout=0.0,
    )
    return ProCap(config)


# -- `procap caption` over image folders (tests/commands: test_caption_many.py, test_caption_file_guards.py) -----------

CAPTION_PAIRS = 5  # pairs in the ``folders`` fixture of tests/commands/conftest.py


def run_caption(checkpoint: Path, *argv: str) -> int:
    """``procap caption --ckpt CHECKPOINT --device cpu --batch-size 2 ARGV``: its exit status."""
    from procap.commands.cli import main

    return main(["caption", "--ckpt", str(checkpoint), "--device", "cpu", "--batch-size", "2", *argv])


def tiny_vqgan():
    """An untrained f16 VQGAN on 32 px images (2 x 2 latents), for similarity scores and procedure caches."""
    from procap.model.vqgan import VQGAN

    config = small_vqgan_config(resolution=32, ch_mult=(1, 2), attn_resolutions=(), embed_dim=32, n_embed=64)
    return VQGAN(config)


# -- synthetic images ------------------------------------------------------------------------------------------
SIZE = 32


def square_image(cx: float, cy: float, size: int = SIZE, half: int = 4) -> torch.Tensor:
    """(3, size, size) grey background with a red square centred at (cx, cy)."""
    img = torch.full((3, size, size), 0.5)
    ys, xs = torch.meshgrid(torch.arange(size), torch.arange(size), indexing="ij")
    inside = ((xs - cx).abs() <= half) & ((ys - cy).abs() <= half)
    for c, v in enumerate((0.9, 0.15, 0.1)):
        img[c][inside] = v
    return img


def textured(shift_x: int, shift_y: int, size: int = 48) -> torch.Tensor:
    """A smooth multi-scale random texture seen through a window moved by (shift_x, shift_y) pixels."""
    gen = torch.Generator().manual_seed(0)
    octaves = [
        weight
        * torch.nn.functional.interpolate(
            torch.rand(1, 3, cells, cells, generator=gen), size=(80, 80), mode="bicubic", align_corners=False
        )
        for cells, weight in ((4, 0.5), (8, 0.3), (16, 0.2))
    ]
    big = sum(octaves).clamp(0, 1)[0]
    return big[:, 12 + shift_y : 12 + shift_y + size, 12 + shift_x : 12 + shift_x + size].contiguous()


def save_png(image: torch.Tensor, path: Path) -> None:
    arr = (image.clamp(0, 1) * 255 + 0.5).to(torch.uint8).permute(1, 2, 0).numpy()
    Image.fromarray(np.ascontiguousarray(arr)).save(path)


# -- procedure caches ---------------------------------------------------------------------------------------
def score_file(path: Path, pairs, frames: int = 5) -> Path:
    """A score file in the authors' CLEVR shape for the given pairs (l = 3 -> 5 scores)."""
    ramp = np.linspace(1, 0, frames).tolist()
    data: dict = {}
    for p in pairs:
        group = "sc" if "_semantic_" in p.id else "nsc"
        key = p.id.rsplit("_", 1)[1]
        data.setdefault(key, {})[f"{group}_sim_matrixes"] = {"bef_inter_sim": [ramp], "inter_aft_sim": [ramp[::-1]]}
    path.write_text(json.dumps(data))
    return path


def prepare_options(tmp_path, pairs, **kw):
    """``PrepareOptions`` for a 32 px, l = 3 cache of ``pairs`` under ``tmp_path``, scored from a score file."""
    from procap.procedure.pipeline import PrepareOptions

    base = {
        "dataset": "clevr-change",
        "root": str(tmp_path),
        "out": str(tmp_path / "cache"),
        "num_generated": 3,
        "image_size": 32,
        "similarity": "scores",
        "scores_file": str(score_file(tmp_path / "s.json", pairs)),
        "direct": False,
        "score_batch": 1,
        "progress": False,
    }
    return PrepareOptions(**{**base, **kw})


# -- small on-disk datasets in the real benchmarks' formats -----------------------------------------------------
def write_image(path: Path, seed: int, size: int = 24, fmt: str | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path, format=fmt)


def make_spot(root: Path) -> Path:
    entries = {
        "train": [
            {"img_id": "1", "sentences": ["the car is gone", ""]},
            {"img_id": "2", "sentences": [""]},
            {"img_id": "1", "sentences": ["a person appeared"]},
        ],
        "val": [{"img_id": "7", "sentences": ["nothing"]}],
        "test": [{"img_id": "9", "sentences": ["the truck moved", "a truck left"]}],
    }
    (root / "annotations").mkdir(parents=True)
    for split, data in entries.items():
        (root / "annotations" / f"{split}.json").write_text(json.dumps(data))
    return root


def make_edit(root: Path) -> Path:
    entries = {
        "train": [{"img0": "a.jpg", "img1": "b.PNG", "sents": ["Make it brighter."], "uid": "Reddit_1"}],
        "valid": [
            {"img0": "c.gif", "img1": "d.jpeg", "sents": ["remove the dog", "delete dog", "no dog"], "uid": "Zhopped_2"}
        ],
        "test": [{"img0": "a.jpg", "img1": "e.JPG", "sents": ["crop", "Crop it", "crop the edges"], "uid": "Reddit_3"}],
    }
    root.mkdir(parents=True, exist_ok=True)
    for split, data in entries.items():
        (root / f"{split}.json").write_text(json.dumps(data))
    return root


# -- the authors' reduced-size checkpoint and what their code computed from it (tests/convert/data/clevr_like) -----
AUTHORS_DATA = Path(__file__).parent / "convert" / "data" / "clevr_like"
AUTHORS_CHECKPOINT = AUTHORS_DATA / "model.chkpt"
AUTHORS_VOCAB = AUTHORS_DATA / "clevr_word2idx.json"
AUTHORS_PAIRS = 8


def authors_expected(name: str) -> torch.Tensor:
    """One of the authors' recorded arrays (``expected/<name>.npy``) as a tensor."""
    return torch.from_numpy(np.load(AUTHORS_DATA / "expected" / f"{name}.npy"))


def authors_image_paths() -> tuple[list[Path], list[Path]]:
    return (
        [AUTHORS_DATA / "images" / f"pair{i:02d}_before.png" for i in range(AUTHORS_PAIRS)],
        [AUTHORS_DATA / "images" / f"pair{i:02d}_after.png" for i in range(AUTHORS_PAIRS)],
    )


def authors_expected_captions() -> list[str]:
    captions = json.loads((AUTHORS_DATA / "expected" / "captions.json").read_text())["captions"]
    return [entry["caption"] for entry in captions]


# -- memory: what a call allocated at its peak ------------------------------------------------------------------
class PeakMemory:
    """Growth of this process's peak resident memory over a ``with`` block, in bytes (``growth``).

    Linux resets the peak (VmHWM) when "5" is written to /proc/self/clear_refs, so the block is measured alone
    even after earlier tests peaked higher; without that file the peak since the start is compared (which can only
    under-report, never fail a call that allocated little).
    """

    def __enter__(self):
        try:
            with open("/proc/self/clear_refs", "w") as handle:
                handle.write("5")
        except OSError:
            pass
        self.start = _peak_rss()
        return self

    def __exit__(self, *exc_info) -> None:
        self.growth = _peak_rss() - self.start


def _peak_rss() -> int:
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


# -- the demo ------------------------------------------------------------------------------------------------------
def micro_demo_budget():
    """A ``procap demo`` budget of a few steps per phase: enough for weights to move, seconds to run."""
    from procap.experiments.demo import DemoBudget

    return DemoBudget(
        scenes=24,
        vqgan_steps=1,
        vqgan_batch=4,
        stage1_steps=2,
        stage1_batch=4,
        stage2_steps=3,
        stage2_batch=4,
        val_pairs=4,
        max_test_pairs=6,
        stage1_pairs=4,
    )
