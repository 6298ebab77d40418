"""CLIP initialisation of the procedure encoder from checkpoints the tests build themselves (OpenAI TorchScript,
open_clip and Hugging Face safetensors): read without running code, mapped block by block, same outputs."""

from __future__ import annotations

import json
import warnings
from collections import OrderedDict

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from procap.commands.cli import main
from procap.convert.clip import clip_config_overrides, init_encoder_from_clip, load_clip_blocks
from procap.core.config import get_preset
from procap.core.errors import ProCapError
from procap.model.procap import ProCap

WIDTH, BLOCKS = 128, 3  # the tiny preset's encoder width; one block more than it uses


class QuickGELU(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(1.702 * x)


class ResidualAttentionBlock(nn.Module):
    """OpenAI CLIP's block (attribute names are the checkpoint's contract); sequence-first input (L, N, D)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(width, width // 64)
        self.ln_1 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            OrderedDict(
                [("c_fc", nn.Linear(width, 4 * width)), ("gelu", QuickGELU()), ("c_proj", nn.Linear(4 * width, width))]
            )
        )
        self.ln_2 = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln_1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.ln_2(x))


class Transformer(nn.Module):
    def __init__(self, width: int, layers: int) -> None:
        super().__init__()
        self.resblocks = nn.Sequential(*[ResidualAttentionBlock(width) for _ in range(layers)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.resblocks(x)


class VisionTransformer(nn.Module):
    def __init__(self, width: int, layers: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, kernel_size=8, stride=8, bias=False)
        self.class_embedding = nn.Parameter(torch.randn(width) * 0.1)
        self.positional_embedding = nn.Parameter(torch.randn(5, width) * 0.1)
        self.ln_pre = nn.LayerNorm(width)
        self.transformer = Transformer(width, layers)
        self.ln_post = nn.LayerNorm(width)
        self.proj = nn.Parameter(torch.randn(width, 32) * 0.1)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        x = self.conv1(image).flatten(2).transpose(1, 2)  # (N, 4, D)
        x = torch.cat([self.class_embedding.expand(x.shape[0], 1, -1), x], dim=1) + self.positional_embedding
        x = self.transformer(self.ln_pre(x).transpose(0, 1)).transpose(0, 1)
        return self.ln_post(x[:, 0]) @ self.proj


class CLIP(nn.Module):
    """A small CLIP with OpenAI's layout (``visual.transformer.resblocks.{i}``...)."""

    def __init__(self, width: int = WIDTH, layers: int = BLOCKS) -> None:
        super().__init__()
        self.visual = VisionTransformer(width, layers)
        self.logit_scale = nn.Parameter(torch.tensor(4.6))
        for p in self.parameters():  # away from LayerNorm's (1, 0) so a mix-up shows
            p.data.add_(torch.randn_like(p) * 0.05)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return self.visual(image) * self.logit_scale


@pytest.fixture(scope="module")
def clip():
    torch.manual_seed(3)
    return CLIP().eval()


@pytest.fixture(scope="module")
def clip_files(clip, tmp_path_factory):
    """The same weights as OpenAI TorchScript, open_clip safetensors and Hugging Face safetensors."""
    root = tmp_path_factory.mktemp("clip")
    with warnings.catch_warnings():  # TorchScript is deprecated, but it is the format OpenAI released
        warnings.simplefilter("ignore")
        torch.jit.save(torch.jit.trace(clip, torch.rand(1, 3, 16, 16)), str(root / "ViT-B-32.pt"))
    state = {k: v.contiguous() for k, v in clip.state_dict().items()}
    save_file(state, str(root / "open_clip_model.safetensors"))
    save_file(_hugging_face_names(state), str(root / "hf_model.safetensors"))
    return {
        "torchscript": root / "ViT-B-32.pt",
        "open_clip": root / "open_clip_model.safetensors",
        "hf": root / "hf_model.safetensors",
    }


def _hugging_face_names(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {"vision_model.embeddings.patch_embedding.weight": state["visual.conv1.weight"]}
    names = {
        "ln_1": "layer_norm1",
        "ln_2": "layer_norm2",
        "attn.out_proj": "self_attn.out_proj",
        "mlp.c_fc": "mlp.fc1",
        "mlp.c_proj": "mlp.fc2",
    }
    for i in range(BLOCKS):
        p, q = f"visual.transformer.resblocks.{i}.", f"vision_model.encoder.layers.{i}."
        for theirs, hf in names.items():
            for leaf in ("weight", "bias"):
                out[f"{q}{hf}.{leaf}"] = state[f"{p}{theirs}.{leaf}"]
        for leaf in ("weight", "bias"):
            for name, chunk in zip("qkv", state[f"{p}attn.in_proj_{leaf}"].chunk(3)):
                out[f"{q}self_attn.{name}_proj.{leaf}"] = chunk.contiguous()
    return out


def _initialised(clip_path) -> ProCap:
    blocks = load_clip_blocks(clip_path)
    model = ProCap(get_preset("tiny", **clip_config_overrides(blocks))).eval()
    assert init_encoder_from_clip(model, blocks) == 2
    return model


@pytest.mark.parametrize("kind", ["torchscript", "open_clip", "hf"])
def test_encoder_layers_compute_what_clip_blocks_computed(clip, clip_files, kind):
    model = _initialised(clip_files[kind])
    assert (model.config.enc_heads, model.config.enc_activation) == (2, "quick_gelu")
    x = torch.randn(2, 7, WIDTH)
    with torch.no_grad():
        for i in range(2):
            ours = model.encoder.layers[i](x)
            theirs = clip.visual.transformer.resblocks[i](x.transpose(0, 1)).transpose(0, 1)
            assert torch.allclose(ours, theirs, atol=1e-5), (kind, i)


def test_torchscript_is_read_without_running_its_code(clip_files, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("torch.jit.load must not be used")

    monkeypatch.setattr(torch.jit, "load", refuse)
    monkeypatch.setattr(torch, "load", refuse)
    blocks = load_clip_blocks(clip_files["torchscript"])
    assert (blocks.width, blocks.mlp, len(blocks.blocks), blocks.heads) == (WIDTH, 4 * WIDTH, BLOCKS, 2)


def test_mismatched_checkpoints_are_refused(tmp_path):
    wide = tmp_path / "wide.safetensors"
    save_file({k: v.contiguous() for k, v in CLIP(width=192, layers=2).state_dict().items()}, str(wide))
    with pytest.raises(ProCapError, match="has width 192 but the encoder's width .* is 128"):
        clip_config_overrides(load_clip_blocks(wide), get_preset("tiny"))
    short = tmp_path / "short.safetensors"
    save_file({k: v.contiguous() for k, v in CLIP(layers=1).state_dict().items()}, str(short))
    with pytest.raises(ProCapError, match="has 1 blocks but the encoder needs 2"):
        init_encoder_from_clip(
            ProCap(get_preset("tiny", enc_heads=2, enc_activation="quick_gelu")), load_clip_blocks(short)
        )
    empty = tmp_path / "empty.safetensors"
    save_file({"text.weight": torch.zeros(2)}, str(empty))
    with pytest.raises(ProCapError, match="no CLIP vision transformer blocks"):
        load_clip_blocks(empty)


def test_pretrain_cli_starts_from_clip(clip, clip_files, tmp_path, capsys):
    from procap.data.synthetic import generate
    from procap.loading.checkpoint import load_checkpoint

    generate(tmp_path / "data", 4, size=64, seed=1, progress=False)
    out = tmp_path / "run"
    argv = [
        "pretrain",
        "--data",
        str(tmp_path / "data"),
        "--out",
        str(out),
        "--preset",
        "tiny",
        "--steps",
        "1",
        "--batch-size",
        "2",
        "--lr",
        "1e-30",
        "--no-progress",
        "--init-encoder",
        f"clip:{clip_files['torchscript']}",
    ]
    assert main(argv) == 0
    model, _, _ = load_checkpoint(out / "stage1.safetensors")
    assert (model.config.enc_heads, model.config.enc_activation) == (2, "quick_gelu")
    block = clip.visual.transformer.resblocks[1]
    assert torch.allclose(model.encoder.layers[1].mlp.fc1.weight, block.mlp.c_fc.weight, atol=1e-6)
    assert torch.allclose(model.encoder.layers[1].attn.v_proj.bias, block.attn.in_proj_bias[2 * WIDTH :], atol=1e-6)
    capsys.readouterr()
    bad = [*argv[:-1], "dinov2:/nowhere"]
    assert main(bad) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("procap: error: --init-encoder takes clip:PATH") and "\n" not in err
    assert json.loads(json.dumps(model.config.to_dict()))["enc_activation"] == "quick_gelu"
