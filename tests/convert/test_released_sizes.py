"""The released CLEVR-Change and Spot-the-Diff checkpoints' key lists (every name and shape at full size, no values)
convert: on the meta device, so no 1.5 GB file is needed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from procap.convert.authors import AuthorsCheckpoint, authors_config, convert_state_dict
from procap.core.weights import load_weights
from procap.model.procap import ProCap, count_parameters

DATA = Path(__file__).parent / "data"
_DTYPES = {"float32": torch.float32, "int64": torch.int64}


@pytest.mark.parametrize(
    "name,vocab,enc_layers,dec_layers,total",
    [("clevr", 80, 12, 2, 161_607_379), ("spot", 834, 4, 3, 109_491_141)],
)
def test_released_key_lists_convert(name, vocab, enc_layers, dec_layers, total):
    keys = json.loads((DATA / f"full_size_keys_{name}.json").read_text())["state_dict"]
    state = {k: torch.empty(v["shape"], dtype=_DTYPES[v["dtype"]], device="meta") for k, v in keys.items()}
    ckpt = AuthorsCheckpoint(Path(name), state, {"num_attention_heads": 8, "max_t_len": 24})
    config = authors_config(ckpt, vocab)
    assert (config.enc_dim, config.enc_heads, config.enc_layers, config.enc_mlp) == (768, 12, enc_layers, 3072)
    assert (config.dec_dim, config.dec_layers, config.dec_ffn, config.vocab_size) == (512, dec_layers, 2048, vocab)
    assert (config.image_size, config.grid_size, config.num_keyframes, config.authors.prefix_tokens) == (224, 14, 2, 26)
    v = config.vqgan
    assert (v.ch, v.ch_mult, v.num_res_blocks, v.z_channels, v.n_embed, v.attn_resolutions) == (
        128,
        (1, 1, 2, 2, 4),
        2,
        256,
        1024,
        (),
    )
    tensors = convert_state_dict(ckpt, config)
    with torch.device("meta"):
        model = ProCap(config)
    load_weights(model, tensors, name)  # every key and shape of the procap model, nothing left over
    assert count_parameters(model)["total"] == sum(t.numel() for t in tensors.values()) == total
