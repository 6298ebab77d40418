"""CLIP vision-transformer blocks -> procedure-encoder layers (``procap pretrain --init-encoder clip:PATH``).

The authors start their procedure encoder from OpenAI's CLIP ViT-B/32 (the first ``enc_layers`` residual blocks
of its visual transformer; not in the paper). This module reads such a checkpoint without running its code and
maps each block onto :class:`procap.model.encoder.EncoderLayer`:

=====================================  ==========================================  =================================
OpenAI / open_clip (``visual.*``)      Hugging Face (``vision_model.encoder.*``)   procap ``encoder.layers.{i}``
=====================================  ==========================================  =================================
``transformer.resblocks.{i}.ln_1``     ``layers.{i}.layer_norm1``                  ``norm1``
``...attn.in_proj_{weight,bias}``      ``layers.{i}.self_attn.{q,k,v}_proj``       ``attn.{q,k,v}_proj`` (split)
``...attn.out_proj``                   ``layers.{i}.self_attn.out_proj``           ``attn.out_proj``
``...ln_2``                            ``layers.{i}.layer_norm2``                  ``norm2``
``...mlp.c_fc`` / ``mlp.c_proj``       ``layers.{i}.mlp.fc1`` / ``mlp.fc2``        ``mlp.fc1`` / ``mlp.fc2``
=====================================  ==========================================  =================================

Formats: OpenAI's TorchScript ``ViT-B-32.pt`` (read through :mod:`procap.convert.archive`, its code never runs),
a ``torch.save`` state dict (open_clip ``.bin`` / ``.pt``, read the same way), or a safetensors file with open_clip
or Hugging Face names. CLIP's MLP uses QuickGELU and its heads have 64 channels, so an initialised encoder takes
``enc_activation="quick_gelu"`` and ``enc_heads = width // 64`` (:func:`clip_config_overrides`).
"""

from __future__ import annotations

import re
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from procap.convert.archive import TORCHSCRIPT_GLOBALS, ScriptModule, load_archive
from procap.core.errors import ProCapError
from procap.core.weights import read_tensors

if TYPE_CHECKING:
    from procap.model.procap import ProCap

CLIP_HEAD_DIM = 64


def clip_heads(width: int) -> int:
    """CLIP's head count for a width: ``width // 64`` (integer division, as OpenAI's ``build_model`` computes it)."""
    return width // CLIP_HEAD_DIM


# Our names for the parameters of one CLIP block, by CLIP (OpenAI / open_clip) name; in_proj is split below.
_BLOCK_NAMES = {
    "ln_1.weight": "norm1.weight",
    "ln_1.bias": "norm1.bias",
    "attn.out_proj.weight": "attn.out_proj.weight",
    "attn.out_proj.bias": "attn.out_proj.bias",
    "ln_2.weight": "norm2.weight",
    "ln_2.bias": "norm2.bias",
    "mlp.c_fc.weight": "mlp.fc1.weight",
    "mlp.c_fc.bias": "mlp.fc1.bias",
    "mlp.c_proj.weight": "mlp.fc2.weight",
    "mlp.c_proj.bias": "mlp.fc2.bias",
}
CLIP_BLOCK_KEYS = (*_BLOCK_NAMES, "attn.in_proj_weight", "attn.in_proj_bias")
_HF_NAMES = {
    "layer_norm1": "ln_1",
    "layer_norm2": "ln_2",
    "self_attn.out_proj": "attn.out_proj",
    "mlp.fc1": "mlp.c_fc",
    "mlp.fc2": "mlp.c_proj",
}


def encoder_layer_tensors(block: dict[str, torch.Tensor], index: int, source: str) -> dict[str, torch.Tensor]:
    """One CLIP residual block (OpenAI names, relative to the block) -> ``encoder.layers.{index}.*`` tensors.

    The packed ``in_proj`` (3D, D) splits into q, k, v row blocks, in that order.

    Raises:
        ProCapError: a parameter of the block is missing or has a shape that does not fit a block.
    """
    missing = [k for k in CLIP_BLOCK_KEYS if k not in block]
    if missing:
        raise ProCapError(f"{source}: CLIP block {index} lacks {', '.join(missing[:3])}")
    in_w, in_b = block["attn.in_proj_weight"], block["attn.in_proj_bias"]
    width = in_w.shape[-1]
    if tuple(in_w.shape) != (3 * width, width) or tuple(in_b.shape) != (3 * width,):
        raise ProCapError(
            f"{source}: CLIP block {index} has an in_proj of shape {tuple(in_w.shape)}, expected (3 x width, width)"
        )
    prefix = f"encoder.layers.{index}."
    out = {prefix + ours: block[theirs].float() for theirs, ours in _BLOCK_NAMES.items()}
    for name, w, b in zip(("q", "k", "v"), in_w.float().chunk(3), in_b.float().chunk(3)):
        out[f"{prefix}attn.{name}_proj.weight"] = w.contiguous()
        out[f"{prefix}attn.{name}_proj.bias"] = b.contiguous()
    return out


@dataclass
class ClipBlocks:
    """The residual blocks of a CLIP vision transformer: ``blocks[i]`` maps OpenAI block-relative names to tensors."""

    blocks: list[dict[str, torch.Tensor]]
    width: int
    mlp: int
    source: str

    @property
    def heads(self) -> int:
        return clip_heads(self.width)


def _flatten_script(obj: Any, prefix: str = "") -> dict[str, torch.Tensor]:
    """Tensors of a TorchScript module tree (stand-ins whose state holds attributes and submodules) by dotted name."""
    out: dict[str, torch.Tensor] = {}
    state = obj.state if isinstance(obj, ScriptModule) else obj
    if not isinstance(state, dict):
        return out
    for name, value in state.items():
        if isinstance(value, torch.Tensor):
            out[prefix + str(name)] = value
        elif isinstance(value, (ScriptModule, dict)):
            out.update(_flatten_script(value, f"{prefix}{name}."))
    return out


def read_clip_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """All tensors of a CLIP checkpoint by name, without executing any pickled code."""
    path = Path(path)
    if not path.is_file():
        raise ProCapError(f"CLIP checkpoint {path} does not exist")
    if path.suffix == ".safetensors":
        return read_tensors(path, "CLIP checkpoint")[0]
    if not zipfile.is_zipfile(path):
        raise ProCapError(f"CLIP checkpoint {path} is neither a safetensors file nor a torch zip archive")
    obj = load_archive(path, TORCHSCRIPT_GLOBALS, torchscript=True, what="CLIP checkpoint")
    if isinstance(obj, dict) and isinstance(obj.get("state_dict"), dict):
        obj = obj["state_dict"]
    return _flatten_script(obj)


def _to_openai_names(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Hugging Face CLIP names -> OpenAI names (``visual.transformer.resblocks.{i}.*``, in_proj packed)."""
    hf = re.compile(r"^(?:.*\.)?vision_model\.encoder\.layers\.(\d+)\.(.+)$")
    out: dict[str, torch.Tensor] = {}
    split: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for key, value in state.items():
        match = hf.match(key)
        if not match:
            continue
        index, rest = int(match.group(1)), match.group(2)
        base = f"visual.transformer.resblocks.{index}."
        proj = re.match(r"self_attn\.([qkv])_proj\.(weight|bias)$", rest)
        if proj:
            split.setdefault((index, proj.group(2)), {})[proj.group(1)] = value
            continue
        module, _, leaf = rest.rpartition(".")
        if module in _HF_NAMES:
            out[base + f"{_HF_NAMES[module]}.{leaf}"] = value
    for (index, leaf), parts in split.items():
        if set(parts) == {"q", "k", "v"}:
            key = f"visual.transformer.resblocks.{index}.attn.in_proj_{leaf}"
            out[key] = torch.cat([parts["q"], parts["k"], parts["v"]])
    return out


def clip_blocks(state: dict[str, torch.Tensor], source: str) -> ClipBlocks:
    """Find the vision transformer's residual blocks in a CLIP state dict (OpenAI, open_clip or HF names)."""
    if not any(".resblocks." in k for k in state) and any("vision_model.encoder.layers." in k for k in state):
        state = _to_openai_names(state)
    pattern = re.compile(r"^(?:.*\.)?visual\.transformer\.resblocks\.(\d+)\.(.+)$")
    found: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in state.items():
        match = pattern.match(key)
        if match:
            found.setdefault(int(match.group(1)), {})[match.group(2)] = value
    if not found:
        raise ProCapError(
            f"{source} holds no CLIP vision transformer blocks (visual.transformer.resblocks.* or "
            f"vision_model.encoder.layers.*)"
        )
    if sorted(found) != list(range(len(found))):
        raise ProCapError(f"{source}: CLIP vision blocks are not numbered 0..{len(found) - 1}")
    blocks = [found[i] for i in range(len(found))]
    first = blocks[0]
    if "attn.in_proj_weight" not in first or "mlp.c_fc.weight" not in first:
        raise ProCapError(f"{source}: CLIP block 0 lacks attn.in_proj_weight or mlp.c_fc.weight")
    width, mlp = first["attn.in_proj_weight"].shape[-1], first["mlp.c_fc.weight"].shape[0]
    return ClipBlocks(blocks, int(width), int(mlp), source)


def parse_init_encoder(spec: str) -> Path:
    """``"clip:PATH"`` (the ``--init-encoder`` value) -> PATH, checked to exist."""
    kind, sep, path = spec.partition(":")
    if kind != "clip" or not sep or not path:
        raise ProCapError(f"--init-encoder takes clip:PATH (a CLIP checkpoint), got {spec!r}")
    if not Path(path).is_file():
        raise ProCapError(f"--init-encoder: CLIP checkpoint {path} does not exist")
    return Path(path)


def load_clip_blocks(path: str | Path) -> ClipBlocks:
    """Read a CLIP checkpoint (TorchScript, torch.save or safetensors) and return its vision blocks."""
    return clip_blocks(read_clip_state_dict(path), f"CLIP checkpoint {path}")


def check_fits(clip: ClipBlocks, width: int, mlp: int, layers: int) -> None:
    """Raise :class:`ProCapError` with one sentence when the encoder cannot take ``clip``'s blocks."""
    if clip.width != width:
        raise ProCapError(
            f"{clip.source} has width {clip.width} but the encoder's width (enc_dim) is {width}; "
            f"choose a preset with enc_dim {clip.width}"
        )
    if clip.heads < 1 or clip.width % clip.heads:
        raise ProCapError(f"{clip.source} has width {clip.width}, which CLIP's width // 64 heads cannot split")
    if clip.mlp != mlp:
        raise ProCapError(f"{clip.source} has an MLP of {clip.mlp} channels but the encoder's (enc_mlp) is {mlp}")
    if len(clip.blocks) < layers:
        raise ProCapError(f"{clip.source} has {len(clip.blocks)} blocks but the encoder needs {layers}")


def clip_config_overrides(clip: ClipBlocks, config: Any = None) -> dict[str, Any]:
    """Config fields that make the encoder compute what CLIP's blocks computed: 64-channel heads, QuickGELU.

    Args:
        clip: the blocks.
        config: the :class:`procap.core.config.ProCapConfig` to be overridden; when given, its encoder sizes are
            checked against the blocks first (:func:`check_fits`).
    """
    if config is not None:
        check_fits(clip, config.enc_dim, config.enc_mlp, config.enc_layers)
    return {"enc_heads": clip.heads, "enc_activation": "quick_gelu"}


def init_encoder_from_clip(model: ProCap, clip: ClipBlocks) -> int:
    """Copy the first ``enc_layers`` CLIP blocks into ``model.encoder.layers``; returns how many were copied.

    The model's config must already carry :func:`clip_config_overrides`; input embeddings, heads and the final
    LayerNorm keep their initialisation.
    """
    config = model.config
    check_fits(clip, config.enc_dim, config.enc_mlp, config.enc_layers)
    if config.enc_heads != clip.heads or config.enc_activation != "quick_gelu":
        raise ProCapError(
            f"the model must use {clip.heads} encoder heads and QuickGELU to take {clip.source}'s "
            f"blocks (procap.convert.clip.clip_config_overrides)"
        )
    tensors: dict[str, torch.Tensor] = {}
    for index in range(config.enc_layers):
        tensors.update(encoder_layer_tensors(clip.blocks[index], index, clip.source))
    own = model.state_dict()
    for name, value in tensors.items():
        if tuple(own[name].shape) != tuple(value.shape):
            raise ProCapError(
                f"{clip.source}: {name} has shape {tuple(value.shape)}, the encoder {tuple(own[name].shape)}"
            )
    with torch.no_grad():
        for name, value in tensors.items():
            own[name].copy_(value)
    return config.enc_layers
