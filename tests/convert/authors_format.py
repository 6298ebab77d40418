"""Write checkpoints in the authors' format for any configuration, and recompute their model from the raw keys.

``write_authors_checkpoint`` builds a state dict with the authors' key names (and their pickled companions:
an ``easydict.EasyDict`` decoder config, ``argparse.Namespace`` options holding ruamel.yaml scalars and lists,
a BertAdam-style optimizer state with a ``src.rtransformer.optimization`` schedule object). The foreign classes
exist only while the file is written (fake modules in ``sys.modules``), so reading it proves that nothing is
imported.

``reference_memory`` / ``reference_logits`` / ``reference_greedy`` restate the authors' model from the
specification, directly on their keys (``torch.nn.MultiheadAttention`` for the CLIP blocks, plain tensor algebra
for their decoder), independently of ``procap.model``: the converted model must agree with them.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
import types
from collections import OrderedDict
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from procap.core.config import VQGANConfig
from procap.model.vqgan import VQGAN

IG = "intermediate_generator."
BLOCKS = IG + "transformer.transformer.resblocks."
DEC = "text_decoder.decoder."


@dataclass
class AuthorsSpec:
    """A configuration of the authors' model (sizes their YAML controls)."""

    image: int = 32
    vqgan_ch: int = 32
    ch_mult: tuple[int, ...] = (1, 1, 2)
    res_blocks: int = 2
    attn_resolutions: tuple[int, ...] = (16,)  # level 1 (nominal 16 px) gets attention
    z: int = 16
    codes: int = 64
    width: int = 64
    blocks: int = 3
    frames: int = 3  # k = 1
    slots: int = 6
    hidden: int = 48
    dec_heads: int = 4
    dec_layers: int = 3
    ffn: int = 96
    vocab: int = 30
    max_t_len: int = 12

    @property
    def grid(self) -> int:
        return self.image // 2 ** (len(self.ch_mult) - 1)

    def vqgan_config(self) -> VQGANConfig:
        return VQGANConfig(
            resolution=self.image,
            ch=self.vqgan_ch,
            ch_mult=self.ch_mult,
            num_res_blocks=self.res_blocks,
            attn_resolutions=self.attn_resolutions,
            z_channels=self.z,
            embed_dim=self.z,
            n_embed=self.codes,
        )


def _randn(gen: torch.Generator, *shape: int, std: float = 0.08) -> torch.Tensor:
    return torch.randn(*shape, generator=gen) * std


def _norm(gen: torch.Generator, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    return 1 + _randn(gen, dim, std=0.1), _randn(gen, dim, std=0.1)


def _clip_block(gen: torch.Generator, prefix: str, d: int, seq: int) -> dict[str, torch.Tensor]:
    out = {}
    out[prefix + "attn_mask"] = torch.zeros(seq, seq)  # a rebuilt buffer: converted away
    out[prefix + "attn.in_proj_weight"], out[prefix + "attn.in_proj_bias"] = _randn(gen, 3 * d, d), _randn(gen, 3 * d)
    out[prefix + "attn.out_proj.weight"], out[prefix + "attn.out_proj.bias"] = _randn(gen, d, d), _randn(gen, d)
    out[prefix + "ln_1.weight"], out[prefix + "ln_1.bias"] = _norm(gen, d)
    out[prefix + "mlp.c_fc.weight"], out[prefix + "mlp.c_fc.bias"] = _randn(gen, 4 * d, d), _randn(gen, 4 * d)
    out[prefix + "mlp.c_proj.weight"], out[prefix + "mlp.c_proj.bias"] = _randn(gen, d, 4 * d), _randn(gen, d)
    out[prefix + "ln_2.weight"], out[prefix + "ln_2.bias"] = _norm(gen, d)
    return out


def _decoder_layer(gen: torch.Generator, prefix: str, h: int, ffn: int) -> dict[str, torch.Tensor]:
    out = {}
    for part in ("selfattn", "attention"):
        for w, std in (("wq", 0.8), ("wk", 0.8), ("wv", 0.12), ("wo", 0.12)):  # the fixture's recipe
            out[f"{prefix}{part}.layer.{w}.weight"] = _randn(gen, h, h, std=std)
        out[f"{prefix}{part}.layernorm.gamma"], out[f"{prefix}{part}.layernorm.beta"] = _norm(gen, h)
    out[prefix + "feedforward.layer.linear1.weight"] = _randn(gen, ffn, h, std=0.16)
    out[prefix + "feedforward.layer.linear1.bias"] = _randn(gen, ffn)
    out[prefix + "feedforward.layer.linear2.weight"] = _randn(gen, h, ffn, std=0.16)
    out[prefix + "feedforward.layer.linear2.bias"] = _randn(gen, h)
    out[prefix + "feedforward.layernorm.gamma"], out[prefix + "feedforward.layernorm.beta"] = _norm(gen, h)
    return out


def authors_state_dict(spec: AuthorsSpec, seed: int = 0, axial: str = "weights.0") -> OrderedDict:
    """Random weights under the authors' key names; ``axial`` picks the spelling (``weights.0`` / ``weights_0``)."""
    gen = torch.Generator().manual_seed(seed)
    d, h, g, t = spec.width, spec.hidden, spec.grid, spec.frames
    state: OrderedDict[str, torch.Tensor] = OrderedDict()
    state[IG + "image_mask"] = _randn(gen, d)
    state[IG + "text_emb.weight"] = _randn(gen, spec.slots + 1, d)
    state[IG + "text_pos_emb.weight"] = _randn(gen, spec.slots, d)
    state[IG + "image_emb.weight"] = _randn(gen, spec.codes + 2, d)
    state[IG + "conv_to_embedding.0.weight"], state[IG + "conv_to_embedding.0.bias"] = _norm(gen, spec.z)
    state[IG + "conv_to_embedding.1.weight"], state[IG + "conv_to_embedding.1.bias"] = (
        _randn(gen, d, spec.z),
        _randn(gen, d),
    )
    sep = "." if axial == "weights.0" else "_"
    for i, shape in enumerate(((1, t, 1, 1, d), (1, 1, g, 1, d), (1, 1, 1, g, d))):
        state[f"{IG}target_pos_emb.weights{sep}{i}"] = _randn(gen, *shape)
    state[IG + "special_emb.weight"], state[IG + "special_pos_emb.weight"] = _randn(gen, 5, d), _randn(gen, 5, d)
    torch.manual_seed(seed)
    vqgan = VQGAN(spec.vqgan_config())
    for key, value in vqgan.state_dict().items():
        state[IG + "vae.model." + key] = value + _randn(gen, *value.shape, std=0.02)
    state[IG + "vae.model.loss.discriminator.main.0.weight"] = _randn(gen, 4, 3, 4, 4)  # the GAN loss: dropped
    seq = spec.slots + 3 + t * g * g
    for i in range(spec.blocks):
        state.update(_clip_block(gen, f"{BLOCKS}{i}.", d, seq))
    for name, out in (("to_logits", spec.codes), ("to_logits_rel", 1), ("to_logits_vid", 1)):
        state[f"{IG}{name}.0.weight"], state[f"{IG}{name}.0.bias"] = _norm(gen, d)
        state[f"{IG}{name}.1.weight"], state[f"{IG}{name}.1.bias"] = _randn(gen, out, d), _randn(gen, out)
    state["mlp.0.weight"], state["mlp.0.bias"] = _randn(gen, d, d, std=0.2), _randn(gen, d)
    state["mlp.2.weight"], state["mlp.2.bias"] = _randn(gen, h, d, std=0.2), _randn(gen, h)
    state["mlp.3.weight"], state["mlp.3.bias"] = _norm(gen, h)
    for layer in range(spec.dec_layers):
        state.update(_decoder_layer(gen, f"{DEC}layers.{layer}.", h, spec.ffn))
    state[DEC + "out.weight"], state[DEC + "out.bias"] = (
        _randn(gen, spec.vocab, h, std=0.3),
        _randn(gen, spec.vocab, std=0.05),
    )
    state["text_decoder.loss_func.one_hot"] = torch.full((1, spec.vocab), 0.1 / (spec.vocab - 2))
    return state


@contextlib.contextmanager
def foreign_classes():
    """Fake ``easydict``, ``ruamel.yaml`` and ``src`` modules, registered only inside the ``with`` block."""
    made: dict[str, type] = {}
    modules = {}
    layout = {
        "easydict": {"EasyDict": dict},
        "ruamel.yaml.scalarfloat": {"ScalarFloat": float},
        "ruamel.yaml.scalarint": {"ScalarInt": int},
        "ruamel.yaml.comments": {"CommentedSeq": list},
        "src.rtransformer.optimization": {"WarmupLinearSchedule": object},
    }
    for module, classes in layout.items():
        parts = module.split(".")
        for i in range(1, len(parts) + 1):
            modules.setdefault(".".join(parts[:i]), types.ModuleType(".".join(parts[:i])))
        for name, base in classes.items():
            cls = type(name, (base,), {"__module__": module, "__qualname__": name})
            setattr(modules[module], name, cls)
            made[name] = cls
    saved = {name: sys.modules.get(name) for name in modules}
    sys.modules.update(modules)
    try:
        yield made
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


def write_authors_checkpoint(path, spec: AuthorsSpec, state: OrderedDict, epoch: int = 3) -> None:
    """``torch.save`` a dict laid out like the authors' stage-2 checkpoint."""
    with foreign_classes() as cls:
        model_cfg = cls["EasyDict"](
            max_t_len=spec.max_t_len,
            max_v_len=spec.frames,
            hidden_size=spec.hidden,
            intermediate_size=spec.ffn,
            num_hidden_layers=spec.dec_layers,
            num_attention_heads=spec.dec_heads,
            hidden_dropout_prob=0.1,
            label_smoothing=0.1,
            vocab_size=spec.vocab,
            mask_token_id=7,
        )
        lr = cls["ScalarFloat"](5e-5)
        lr.__dict__.update(_width=4, _prec=1)  # ruamel keeps formatting attributes on its scalars
        skip = cls["CommentedSeq"](["to_logits.1.bias", "image_emb.weight"])
        opt = argparse.Namespace(
            dset_name="spot",
            lr=lr,
            max_k=cls["ScalarInt"](spec.frames - 2),
            skip_params=skip,
            decoder_param=model_cfg,
            cuda=False,
        )
        schedule = cls["WarmupLinearSchedule"]()
        schedule.__dict__.update(warmup=0.1, t_total=40.0)
        first = next(iter(state.values()))
        optimizer = {
            "state": {0: {"step": 1, "next_m": torch.zeros_like(first), "next_v": torch.zeros_like(first)}},
            "param_groups": [{"lr": 5e-5, "schedule": schedule, "params": [0]}],
        }
        torch.save({"model": state, "model_cfg": model_cfg, "opt": opt, "epoch": epoch, "optimizer": optimizer}, path)


def write_vocab(path, size: int) -> None:
    """A word2idx JSON of ``size`` entries: the authors' 8 specials, then words."""
    import json

    specials = ["[PAD]", "[CLS]", "[SEP]", "[VID]", "[BOS]", "[EOS]", "[UNK]", "[MASK]"]
    words = specials + [f"word{i}" for i in range(size - len(specials))]
    path.write_text(json.dumps({w: i for i, w in enumerate(words)}))


# ------------------------------------------------------------------------------------------ independent reference
def _key(state: dict, name: str) -> torch.Tensor:
    return state[name].double()


def reference_memory(state: dict, features: torch.Tensor, spec: AuthorsSpec) -> torch.Tensor:
    """The authors' stage-2 encoder and memory MLP, restated on their keys.

    Args:
        state: their state dict (``weights.N`` spelling).
        features: (B, 2, z, g, g) VQGAN encoder output of the before and after images.

    Returns:
        (B, frames * g * g, hidden) memory, float64.
    """
    b, d, n, s = features.shape[0], spec.width, spec.grid**2, spec.slots
    tokens = features.double().flatten(3).transpose(2, 3)  # (B, 2, n, z) row-major
    tokens = F.layer_norm(
        tokens, (spec.z,), _key(state, IG + "conv_to_embedding.0.weight"), _key(state, IG + "conv_to_embedding.0.bias")
    )
    tokens = F.linear(
        tokens, _key(state, IG + "conv_to_embedding.1.weight"), _key(state, IG + "conv_to_embedding.1.bias")
    )
    queries = _key(state, IG + "image_mask").expand(b, (spec.frames - 2) * n, d)
    visual = torch.cat([tokens[:, 0], queries, tokens[:, 1]], dim=1)
    axial = sum(_key(state, f"{IG}target_pos_emb.weights.{i}") for i in range(3))  # broadcast to (1, T, g, g, D)
    visual = visual + axial.reshape(1, -1, d)
    # The caption slots and control tokens are sums of two fp32 tables, formed in fp32 as their code does.
    text = (state[IG + "text_emb.weight"][:s] + state[IG + "text_pos_emb.weight"]).double()
    special = (state[IG + "special_emb.weight"] + state[IG + "special_pos_emb.weight"]).double()
    x = torch.cat([torch.cat([text, special[1:3]]).expand(b, s + 2, d), visual], dim=1)
    mask = torch.zeros(x.shape[1], x.shape[1], dtype=torch.float64)
    mask[s + 1, : s + 1] = float("-inf")
    mask[s + 2, : s + 2] = float("-inf")
    for i in range(spec.blocks):
        p = f"{BLOCKS}{i}."
        mha = torch.nn.MultiheadAttention(d, d // 64, batch_first=True).double()
        mha.load_state_dict({k: _key(state, p + "attn." + k) for k in mha.state_dict()})
        h = F.layer_norm(x, (d,), _key(state, p + "ln_1.weight"), _key(state, p + "ln_1.bias"))
        with torch.no_grad():
            x = x + mha(h, h, h, attn_mask=mask, need_weights=False)[0]
        h = F.layer_norm(x, (d,), _key(state, p + "ln_2.weight"), _key(state, p + "ln_2.bias"))
        h = F.linear(h, _key(state, p + "mlp.c_fc.weight"), _key(state, p + "mlp.c_fc.bias"))
        x = x + F.linear(
            h * torch.sigmoid(1.702 * h), _key(state, p + "mlp.c_proj.weight"), _key(state, p + "mlp.c_proj.bias")
        )
    out = F.relu(F.linear(x[:, s + 2 :], _key(state, "mlp.0.weight"), _key(state, "mlp.0.bias")))
    out = F.linear(out, _key(state, "mlp.2.weight"), _key(state, "mlp.2.bias"))
    return F.layer_norm(out, (spec.hidden,), _key(state, "mlp.3.weight"), _key(state, "mlp.3.bias"))


def _their_norm(x: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    return gamma * (x - x.mean(-1, keepdim=True)) / (x.std(-1, keepdim=True) + 1e-6) + beta


def _their_attention(state: dict, p: str, x: torch.Tensor, ctx: torch.Tensor, heads: int, causal: bool) -> torch.Tensor:
    h = x.shape[-1]

    def split(t: torch.Tensor) -> torch.Tensor:
        return t.view(t.shape[0], t.shape[1], heads, h // heads).transpose(1, 2)

    q, k, v = (split(src @ _key(state, f"{p}layer.{w}.weight").T) for w, src in (("wq", x), ("wk", ctx), ("wv", ctx)))
    scores = q @ k.transpose(-2, -1)
    if causal:
        scores = scores + torch.full(scores.shape[-2:], float("-inf"), dtype=scores.dtype).triu(1)
    out = (scores / math.sqrt(h)).softmax(-1) @ v
    return out.transpose(1, 2).reshape(x.shape) @ _key(state, p + "layer.wo.weight").T


def reference_positions(length: int, h: int) -> torch.Tensor:
    """(length, h) float64: ``sin(p / 10000^(2i/h))`` at column 2i, ``cos`` of the same at 2i + 1."""
    pe = torch.zeros(length, h, dtype=torch.float64)
    for pos in range(length):
        for i in range(0, h, 2):
            angle = pos / 10000 ** (i / h)
            pe[pos, i], pe[pos, i + 1] = math.sin(angle), math.cos(angle)
    return pe


def reference_logits(state: dict, ids: torch.Tensor, memory: torch.Tensor, spec: AuthorsSpec) -> torch.Tensor:
    """The authors' decoder restated on their keys: (B, L) ids, (B, N, H) memory -> (B, L, V) float64 logits."""
    h, length = spec.hidden, ids.shape[1]
    pe = reference_positions(length, h)
    embedding = _key(state, DEC + "out.weight")
    x = embedding[ids] * math.sqrt(h) + pe
    memory = memory.double()
    for layer in range(spec.dec_layers):
        p = f"{DEC}layers.{layer}."
        for part, ctx, causal in (("selfattn", None, True), ("attention", memory, False)):
            a = _their_attention(state, f"{p}{part}.", x, x if ctx is None else ctx, spec.dec_heads, causal)
            x = _their_norm(x + a, _key(state, f"{p}{part}.layernorm.gamma"), _key(state, f"{p}{part}.layernorm.beta"))
        f = F.relu(
            F.linear(
                x,
                _key(state, p + "feedforward.layer.linear1.weight"),
                _key(state, p + "feedforward.layer.linear1.bias"),
            )
        )
        f = F.linear(
            f, _key(state, p + "feedforward.layer.linear2.weight"), _key(state, p + "feedforward.layer.linear2.bias")
        )
        x = _their_norm(
            x + f, _key(state, p + "feedforward.layernorm.gamma"), _key(state, p + "feedforward.layernorm.beta")
        )
    return x @ embedding.T + _key(state, DEC + "out.bias")


def reference_greedy(state: dict, memory: torch.Tensor, spec: AuthorsSpec) -> torch.Tensor:
    """Their decoding: BOS, then every step's argmax with only [UNK] (6) suppressed -> (B, max_t_len - 1)."""
    ids = torch.zeros(memory.shape[0], spec.max_t_len, dtype=torch.long)
    ids[:, 0] = 4
    for t in range(spec.max_t_len - 1):
        logits = reference_logits(state, ids, memory, spec)[:, t]
        logits[:, 6] = -1e10
        ids[:, t + 1] = logits.argmax(-1)
    return ids[:, 1:]
