"""Convert the authors' released ProCap checkpoints into procap models (``procap convert --from authors``).

Their stage-2 file is a ``torch.save`` dict ``{model, model_cfg, opt, epoch, optimizer}`` whose pickle names
``easydict``, ``ruamel.yaml`` and their own ``src`` classes; it is read with the restricted unpickler of
:mod:`procap.convert.archive` (no pickled code runs). Every size comes from the state dict itself (checked against
``model_cfg`` where that also has it), so any configuration of their model converts:

============================================================  =====================================================
theirs (``intermediate_generator.`` = IG)                       procap (``config.authors.enabled``)
============================================================  =====================================================
``IG.vae.model.{encoder,decoder,quantize,quant_conv,...}``      ``vqgan.*`` (taming layout; ``vae.model.loss.*`` dropped)
``IG.conv_to_embedding.{0,1}``                                  ``encoder.visual_norm``, ``encoder.visual_proj``
``IG.text_emb[i] + IG.text_pos_emb[i]`` (i < L),                ``encoder.prefix`` (L + 2, D): constant at stage 2
``IG.special_emb[j] + IG.special_pos_emb[j]`` (j = 1, 2)
``IG.image_mask``                                               ``mask_embedding`` (the procedure queries)
``IG.target_pos_emb.weights.{0,1,2}`` (or ``weights_{0,1,2}``)  ``pos_frame``, ``pos_row``, ``pos_col``
``IG.transformer.transformer.resblocks.{i}``                    ``encoder.layers.{i}`` (:mod:`procap.convert.clip`)
``mlp.{0,2,3}``                                                 ``memory_mlp.{0,2,3}``
``text_decoder.decoder.layers.{l}.{selfattn,attention,         ``decoder.layers.{l}.{self_attn,cross_attn,ffn}`` and
feedforward}.{layer,layernorm}``                                ``{self,cross,ffn}_norm``
``text_decoder.decoder.out``                                    ``decoder.out``
============================================================  =====================================================

Ignored: the stage-1 heads and token table (``IG.to_logits*``, ``IG.image_emb``), the rebuilt buffers
(``resblocks.{i}.attn_mask``, ``text_decoder.loss_func.one_hot``), the VQGAN's loss module and the optimizer.
Any other key is an error, and the converted tensors must fill the procap model exactly (keys and shapes).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from procap.convert.archive import AUTHORS_GLOBALS, AttrDict, OptionsNamespace, load_archive
from procap.convert.clip import CLIP_BLOCK_KEYS, clip_heads, encoder_layer_tensors
from procap.core.config import AuthorsVariant, ProCapConfig, VQGANConfig
from procap.core.errors import ProCapError
from procap.core.weights import check_shapes, load_weights
from procap.data import Vocabulary
from procap.model.procap import ProCap

IG = "intermediate_generator."
VAE = IG + "vae.model."
BLOCKS = IG + "transformer.transformer.resblocks."
DEC = "text_decoder.decoder."
# Keys the conversion drops on purpose (stage-1 parts, buffers the authors rebuild, the VQGAN's GAN/LPIPS loss).
_IGNORED = re.compile(
    r"^(intermediate_generator\.(image_emb\.|to_logits(_rel|_vid|_text)?\.|vae\.model\.loss\.|"
    r"transformer\.transformer\.resblocks\.\d+\.attn_mask$)|text_decoder\.loss_func\.)"
)
_DECODER_PARTS = {
    "selfattn": ("self_attn", "self_norm"),
    "attention": ("cross_attn", "cross_norm"),
    "feedforward": ("ffn", "ffn_norm"),
}
_DECODER_LEAVES = {
    "wq": "q_proj",
    "wk": "k_proj",
    "wv": "v_proj",
    "wo": "out_proj",
    "linear1": "fc1",
    "linear2": "fc2",
    "gamma": "weight",
    "beta": "bias",
}
SPECIAL_ROWS = (1, 2)  # the two control tokens of stage 2 ("ST1", "VID"); row 0 and "REL" are stage-1 only


@dataclass
class AuthorsCheckpoint:
    """What the conversion reads from the authors' file."""

    path: Path
    state: dict[str, torch.Tensor]
    model_cfg: dict[str, Any]
    options: dict[str, Any] = field(default_factory=dict)
    epoch: int | None = None


def _plain(value: Any) -> Any:
    """Stand-ins -> plain JSON-able values (YAML scalars to numbers, nested dicts, Namespace to dict)."""
    if isinstance(value, OptionsNamespace):
        value = value.state if isinstance(value.state, dict) else {}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    for kind in (bool, int, float, str):
        if isinstance(value, kind):
            return kind(value)
    return None  # None itself, or an object only a stand-in knows (a schedule, a YAML comment)


def read_authors_checkpoint(path: str | Path) -> AuthorsCheckpoint:
    """Read the authors' stage-2 checkpoint safely: its state dict, decoder config, options and epoch."""
    path = Path(path)
    obj = load_archive(path, AUTHORS_GLOBALS, what="authors' checkpoint")
    if not isinstance(obj, dict) or not isinstance(obj.get("model"), dict):
        raise ProCapError(
            f"authors' checkpoint {path} has no 'model' state dict (expected their stage-2 "
            f"checkpoint, a dict with model, model_cfg, opt, epoch, optimizer)"
        )
    state = {str(k): v for k, v in obj["model"].items()}
    bad = [k for k, v in state.items() if not isinstance(v, torch.Tensor)]
    if bad:
        raise ProCapError(f"authors' checkpoint {path}: model entry {bad[0]} is not a tensor")
    if state and all(k.startswith("module.") for k in state):  # saved from a DDP wrapper
        state = {k[len("module.") :]: v for k, v in state.items()}
    cfg = obj.get("model_cfg")
    if not isinstance(cfg, (dict, AttrDict)):
        raise ProCapError(f"authors' checkpoint {path} has no model_cfg (their decoder configuration)")
    epoch = obj.get("epoch")
    return AuthorsCheckpoint(
        path,
        _normalise_axial(state, path),
        _plain(cfg),
        _plain(obj.get("opt")) or {},
        epoch if isinstance(epoch, int) else None,
    )


def _normalise_axial(state: dict[str, torch.Tensor], path: Path) -> dict[str, torch.Tensor]:
    """Accept both spellings of the axial embedding (``weights.0``: package 0.3.x; ``weights_0``: 0.2.x)."""
    out = {}
    for key, value in state.items():
        new = re.sub(r"(target_pos_emb\.weights)_(\d)$", r"\1.\2", key)
        if new != key and new in state:
            raise ProCapError(f"authors' checkpoint {path} has both {key} and {new}")
        out[new] = value
    return out


def _need(state: dict[str, torch.Tensor], key: str, path: Path, dims: int | None = None) -> torch.Tensor:
    if key not in state:
        raise ProCapError(f"authors' checkpoint {path} lacks {key}; it is not one of their stage-2 checkpoints")
    value = state[key]
    if dims is not None and value.dim() != dims:
        raise ProCapError(f"authors' checkpoint {path}: {key} has shape {tuple(value.shape)}, expected {dims} dims")
    return value


def _indices(state: dict[str, torch.Tensor], prefix: str, path: Path) -> int:
    """How many numbered children ``prefix{i}.`` exist; they must be 0..n-1."""
    found = sorted({int(m.group(1)) for k in state if (m := re.match(re.escape(prefix) + r"(\d+)\.", k))})
    if found != list(range(len(found))):
        raise ProCapError(f"authors' checkpoint {path}: {prefix}* is not numbered 0..{len(found) - 1}")
    return len(found)


def _vqgan_config(state: dict[str, torch.Tensor], grid: int, path: Path) -> VQGANConfig:
    """The taming VQGAN's hyper-parameters from its tensors (levels, widths, res blocks, attention, codebook)."""
    enc = VAE + "encoder."
    ch = _need(state, enc + "conv_in.weight", path, 4).shape[0]
    levels = _indices(state, enc + "down.", path)
    if levels < 1:
        raise ProCapError(f"authors' checkpoint {path} has no VQGAN encoder levels ({enc}down.*)")
    mult = []
    for i in range(levels):
        width = _need(state, f"{enc}down.{i}.block.0.conv1.weight", path, 4).shape[0]
        if width % ch:
            raise ProCapError(f"authors' checkpoint {path}: VQGAN level {i} width {width} is not a multiple of {ch}")
        mult.append(width // ch)
    resolution = grid * 2 ** (levels - 1)
    attn = tuple(resolution // 2**i for i in range(levels) if any(k.startswith(f"{enc}down.{i}.attn.") for k in state))
    codebook = _need(state, VAE + "quantize.embedding.weight", path, 2)
    return VQGANConfig(
        resolution=resolution,
        in_channels=state[enc + "conv_in.weight"].shape[1],
        out_ch=_need(state, VAE + "decoder.conv_out.weight", path, 4).shape[0],
        ch=ch,
        ch_mult=tuple(mult),
        num_res_blocks=_indices(state, enc + "down.0.block.", path),
        attn_resolutions=attn,
        z_channels=_need(state, enc + "conv_out.weight", path, 4).shape[0],
        embed_dim=codebook.shape[1],
        n_embed=codebook.shape[0],
    )


def _check_cfg(cfg: dict[str, Any], name: str, derived: int, path: Path) -> None:
    """``model_cfg[name]``, when present, must equal the size the tensors have."""
    value = cfg.get(name)
    if value is not None and (not isinstance(value, (int, float)) or int(value) != derived):
        raise ProCapError(f"authors' checkpoint {path}: model_cfg.{name} = {value!r} but the weights say {derived}")


def authors_config(ckpt: AuthorsCheckpoint, vocab_size: int) -> ProCapConfig:
    """The :class:`ProCapConfig` (``authors.enabled``) of a checkpoint, every size derived from its tensors."""
    state, cfg, path = ckpt.state, ckpt.model_cfg, ckpt.path
    proj = _need(state, IG + "conv_to_embedding.1.weight", path, 2)  # (D, z)
    width = proj.shape[0]
    frames = _need(state, IG + "target_pos_emb.weights.0", path).shape
    rows = _need(state, IG + "target_pos_emb.weights.1", path).shape
    cols = _need(state, IG + "target_pos_emb.weights.2", path).shape
    if any(len(shape) != 5 for shape in (frames, rows, cols)) or rows[2] != cols[3]:
        raise ProCapError(
            f"authors' checkpoint {path}: axial position tables {tuple(frames)}, {tuple(rows)}, "
            f"{tuple(cols)} are not (1, T, 1, 1, D), (1, 1, H, 1, D), (1, 1, 1, W, D) with H = W"
        )
    out = _need(state, DEC + "out.weight", path, 2)  # (V, H)
    vocab, hidden = out.shape
    layers = _indices(state, DEC + "layers.", path)
    if "num_attention_heads" not in cfg:
        raise ProCapError(f"authors' checkpoint {path}: model_cfg lacks num_attention_heads (the decoder's heads)")
    for name, derived in (
        ("hidden_size", hidden),
        ("num_hidden_layers", layers),
        ("vocab_size", vocab),
        ("intermediate_size", _need(state, DEC + "layers.0.feedforward.layer.linear1.weight", path, 2).shape[0]),
    ):
        _check_cfg(cfg, name, derived, path)
    if vocab != vocab_size:
        raise ProCapError(
            f"authors' checkpoint {path} has a vocabulary of {vocab} words but the vocabulary file has "
            f"{vocab_size}; pass the word2idx file the model was trained with"
        )
    if clip_heads(width) < 1 or width % clip_heads(width):
        raise ProCapError(f"authors' checkpoint {path}: encoder width {width} cannot be split into width // 64 heads")
    slots = _need(state, IG + "text_pos_emb.weight", path, 2).shape[0]
    vqgan = _vqgan_config(state, rows[2], path)
    try:
        return _build_config(ckpt, state, cfg, vqgan, width, frames[1], slots, hidden, layers, vocab)
    except (ValueError, KeyError, TypeError) as exc:
        raise ProCapError(f"authors' checkpoint {path} describes a model procap cannot build ({exc})") from None


def _build_config(
    ckpt: AuthorsCheckpoint,
    state: dict[str, torch.Tensor],
    cfg: dict[str, Any],
    vqgan: VQGANConfig,
    width: int,
    frames: int,
    slots: int,
    hidden: int,
    layers: int,
    vocab: int,
) -> ProCapConfig:
    path = ckpt.path
    return ProCapConfig(
        name=f"authors-{ckpt.options.get('dset_name') or 'model'}",
        vqgan=vqgan,
        image_size=vqgan.resolution,
        vocab_size=vocab,
        max_caption_len=int(cfg.get("max_t_len") or slots),
        num_keyframes=frames - 2,
        enc_dim=width,
        enc_heads=clip_heads(width),
        enc_mlp=_need(state, BLOCKS + "0.mlp.c_fc.weight", path, 2).shape[0],
        enc_layers=_indices(state, BLOCKS, path),
        enc_activation="quick_gelu",
        dropout=float(cfg.get("hidden_dropout_prob", 0.1)),
        authors=AuthorsVariant(enabled=True, prefix_tokens=slots + 2, final_norm=False),
        dec_dim=hidden,
        dec_heads=int(cfg["num_attention_heads"]),
        dec_ffn=state[DEC + "layers.0.feedforward.layer.linear1.weight"].shape[0],
        dec_layers=layers,
        label_smoothing=float(cfg.get("label_smoothing", 0.1)),
    )


def _decoder_key(key: str) -> str | None:
    """``text_decoder.decoder.layers.{l}.{part}.{layer|layernorm}.{leaf}`` / ``out.*`` -> our name (None: unknown)."""
    if key.startswith(DEC + "out."):
        return "decoder.out." + key[len(DEC + "out.") :]
    match = re.match(
        re.escape(DEC) + r"layers\.(\d+)\.(selfattn|attention|feedforward)\.(layer|layernorm)\.(\w+)"
        r"(?:\.(weight|bias))?$",
        key,
    )
    if not match or match.group(4) not in _DECODER_LEAVES:
        return None
    index, part, kind, leaf, suffix = match.groups()
    module = _DECODER_PARTS[part][0 if kind == "layer" else 1]
    name = _DECODER_LEAVES[leaf]
    if kind == "layer":  # wq.weight -> self_attn.q_proj.weight, linear1.bias -> ffn.fc1.bias
        return f"decoder.layers.{index}.{module}.{name}.{suffix}" if suffix else None
    return f"decoder.layers.{index}.{module}.{name}" if suffix is None else None


def _simple_key(key: str) -> str | None:
    """Keys that map one to one (VQGAN, frame embedding, mask vector, memory MLP, decoder); None otherwise."""
    if key.startswith(VAE) and key[len(VAE) :].split(".")[0] in (
        "encoder",
        "decoder",
        "quantize",
        "quant_conv",
        "post_quant_conv",
    ):
        return "vqgan." + key[len(VAE) :]
    renames = {
        IG + "conv_to_embedding.0.": "encoder.visual_norm.",
        IG + "conv_to_embedding.1.": "encoder.visual_proj.",
        "mlp.0.": "memory_mlp.0.",
        "mlp.2.": "memory_mlp.2.",
        "mlp.3.": "memory_mlp.3.",
    }
    for theirs, ours in renames.items():
        if key.startswith(theirs) and key.count(".") == theirs.count("."):
            return ours + key[len(theirs) :]
    if key == IG + "image_mask":
        return "mask_embedding"
    return _decoder_key(key) if key.startswith(DEC) else None


# Keys consumed by the composite conversions (prefix, axial positions, encoder blocks).
_COMPOSITE = re.compile(
    r"^intermediate_generator\.((text_emb|text_pos_emb|special_emb|special_pos_emb)\.weight|"
    r"target_pos_emb\.weights\.[012]|transformer\.transformer\.resblocks\.\d+\..+)$"
)


def _prefix(state: dict[str, torch.Tensor], slots: int, path: Path) -> torch.Tensor:
    """(slots + 2, D): caption slot i = text_emb[i] + text_pos_emb[i], then the two control tokens."""
    text, text_pos = state[IG + "text_emb.weight"], state[IG + "text_pos_emb.weight"]
    special = _need(state, IG + "special_emb.weight", path, 2)
    special_pos = _need(state, IG + "special_pos_emb.weight", path, 2)
    if text.shape[0] < slots or min(special.shape[0], special_pos.shape[0]) <= max(SPECIAL_ROWS):
        raise ProCapError(
            f"authors' checkpoint {path}: text_emb {tuple(text.shape)} / special_emb "
            f"{tuple(special.shape)} are too short for {slots} caption slots and the control tokens"
        )
    rows = [special[j] + special_pos[j] for j in SPECIAL_ROWS]
    return torch.cat([text[:slots] + text_pos, torch.stack(rows)]).float()


def convert_state_dict(ckpt: AuthorsCheckpoint, config: ProCapConfig) -> dict[str, torch.Tensor]:
    """The procap state dict of an authors' checkpoint (keys of ``ProCap(config)``).

    Raises:
        ProCapError: a key is neither mapped nor known to be ignorable.
    """
    state, path = ckpt.state, ckpt.path
    out: dict[str, torch.Tensor] = {}
    unknown = []
    for key, value in state.items():
        if _IGNORED.match(key) or _COMPOSITE.match(key):
            continue
        ours = _simple_key(key)
        if ours is None:
            unknown.append(key)
        else:
            out[ours] = value.float()
    if unknown:
        more = f" and {len(unknown) - 3} more" if len(unknown) > 3 else ""
        raise ProCapError(
            f"authors' checkpoint {path} has keys the converter does not know: {', '.join(unknown[:3])}{more}"
        )
    out["encoder.prefix"] = _prefix(state, config.authors.prefix_tokens - 2, path)
    d = config.enc_dim
    for name, index in (("pos_frame", 0), ("pos_row", 1), ("pos_col", 2)):
        out[name] = state[f"{IG}target_pos_emb.weights.{index}"].float().reshape(-1, d)
    for i in range(config.enc_layers):
        prefix = f"{BLOCKS}{i}."
        block = {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix) and not k.endswith("attn_mask")}
        extra = sorted(set(block) - set(CLIP_BLOCK_KEYS))
        if extra:
            raise ProCapError(f"authors' checkpoint {path} has keys the converter does not know: {prefix}{extra[0]}")
        out.update(encoder_layer_tensors(block, i, f"authors' checkpoint {path}"))
    return out


def convert_authors_checkpoint(path: str | Path, vocab_path: str | Path) -> tuple[Any, Any, dict[str, Any]]:
    """Build a procap model from the authors' stage-2 checkpoint and their vocabulary file.

    Args:
        path: their ``model.chkpt`` (a ``torch.save`` zip; read without executing its pickle).
        vocab_path: their ``word2idx`` JSON (``[PAD] [CLS] [SEP] [VID] [BOS] [EOS] [UNK] [MASK]`` at 0..7).

    Returns:
        ``(model, vocab, info)``: a :class:`procap.model.procap.ProCap` (``authors.enabled``, eval mode, CPU,
        fp32), the :class:`procap.data.Vocabulary`, and JSON-able facts (source, epoch, dataset, ignored keys).
    """
    vocab = Vocabulary.load(vocab_path)
    ckpt = read_authors_checkpoint(path)
    config = authors_config(ckpt, len(vocab))
    tensors = convert_state_dict(ckpt, config)
    with torch.device("meta"):  # the sizes came from the file: compare them before the model takes memory
        check_shapes(ProCap(config).state_dict(), tensors, path)
    model = ProCap(config)
    load_weights(model, tensors, path)
    ignored = sorted(k for k in ckpt.state if _IGNORED.match(k))
    info = {
        "converted_from": "authors",
        "source": str(path),
        "epoch": ckpt.epoch,
        "dataset": ckpt.options.get("dset_name"),
        "ignored_keys": len(ignored),
    }
    return model.eval(), vocab, info
