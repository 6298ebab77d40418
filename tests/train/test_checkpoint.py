"""Safetensors checkpoints: round trips, metadata, tied weights, no pickle, clear errors, training state."""

from __future__ import annotations

import json
import pickle
import random

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from procap.core.config import ProCapConfig
from procap.core.errors import ProCapError
from procap.loading.checkpoint import load_checkpoint, read_checkpoint_metadata, save_checkpoint
from procap.train.state import (
    capture_rng_state,
    load_training_state,
    restore_rng_state,
    save_training_state,
    state_paths,
)


def _images(batch: int = 3, size: int = 16):
    gen = torch.Generator().manual_seed(1)
    return torch.rand(batch, 3, size, size, generator=gen), torch.rand(batch, 3, size, size, generator=gen)


def _storages(model: torch.nn.Module) -> int:
    return len({t.untyped_storage().data_ptr() for t in model.state_dict().values()})


def test_round_trip_same_outputs(tmp_path, model, vocab):
    path = save_checkpoint(tmp_path / "m.safetensors", model, vocab, {"step": 7})
    loaded, loaded_vocab, meta = load_checkpoint(path)
    before, after = _images()
    model.eval()
    assert torch.equal(model.generate(before, after), loaded.generate(before, after))
    caps = torch.tensor([vocab.encode("the small red cube moved", max_len=12)] * 3)
    assert torch.equal(model.stage2_loss(before, after, caps)["loss"], loaded.stage2_loss(before, after, caps)["loss"])
    for key, value in model.state_dict().items():
        assert torch.equal(value, loaded.state_dict()[key]), key
    assert len(loaded_vocab) == len(vocab) and loaded_vocab.encode("a cube") == vocab.encode("a cube")
    assert meta["extra"] == {"step": 7}
    assert _storages(loaded) == _storages(model)  # tied decoder weights are tied again after loading


def test_loaded_then_saved_is_identical(tmp_path, model, vocab):
    first = save_checkpoint(tmp_path / "a.safetensors", model, vocab)
    loaded, loaded_vocab, _ = load_checkpoint(first)
    second = save_checkpoint(tmp_path / "b.safetensors", loaded, loaded_vocab)
    a, b = load_file(first), load_file(second)
    assert a.keys() == b.keys()
    for key in a:
        assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), key
    assert read_checkpoint_metadata(first) == read_checkpoint_metadata(second)


def test_metadata_holds_config_and_vocab(tmp_path, model, vocab):
    path = save_checkpoint(tmp_path / "m.safetensors", model, vocab)
    with safe_open(str(path), framework="pt") as handle:
        raw = handle.metadata()
    config = json.loads(raw["config"])
    assert config == json.loads(json.dumps(model.config.to_dict()))
    assert json.dumps(ProCapConfig.from_dict(config).to_dict()) == raw["config"]
    word2idx = json.loads(raw["vocab"])
    assert len(word2idx) == len(vocab) and word2idx["[PAD]"] == 0 and word2idx["[EOS]"] == vocab.eos_id
    assert "cube" in word2idx


def test_tied_weights_stored_once(tmp_path, model, vocab):
    path = save_checkpoint(tmp_path / "m.safetensors", model, vocab)
    aliases = read_checkpoint_metadata(path)["aliases"]
    stored = load_file(path)
    assert len(stored) + len(aliases) == len(model.state_dict())
    assert all(alias not in stored and target in stored for alias, target in aliases.items())


def test_loading_runs_no_pickle(tmp_path, model, vocab, monkeypatch):
    path = save_checkpoint(tmp_path / "m.safetensors", model, vocab)

    def forbidden(*args, **kwargs):
        raise AssertionError("pickle used while loading a checkpoint")

    monkeypatch.setattr(pickle, "loads", forbidden)
    monkeypatch.setattr(pickle, "load", forbidden)
    monkeypatch.setattr(torch, "load", forbidden)
    load_checkpoint(path)


@pytest.mark.parametrize("content", [b"", b"not a safetensors file at all", b"\xff" * 64])
def test_corrupt_file_names_the_file(tmp_path, content):
    path = tmp_path / "broken.safetensors"
    path.write_bytes(content)
    with pytest.raises(ProCapError, match="broken.safetensors"):
        load_checkpoint(path)


def test_missing_and_foreign_files(tmp_path):
    with pytest.raises(ProCapError, match="missing.safetensors"):
        load_checkpoint(tmp_path / "missing.safetensors")
    from safetensors.torch import save_file

    save_file({"w": torch.zeros(2)}, str(tmp_path / "foreign.safetensors"))
    with pytest.raises(ProCapError, match="not a ProCap checkpoint"):
        load_checkpoint(tmp_path / "foreign.safetensors")


def test_weights_that_do_not_fit(tmp_path, model, vocab):
    path = save_checkpoint(tmp_path / "m.safetensors", model, vocab)
    tensors = load_file(path)
    tensors.pop(next(iter(tensors)))
    with safe_open(str(path), framework="pt") as handle:
        meta = handle.metadata()
    from safetensors.torch import save_file

    save_file(tensors, str(tmp_path / "short.safetensors"), metadata=meta)
    with pytest.raises(ProCapError, match="missing"):
        load_checkpoint(tmp_path / "short.safetensors")


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_weights_name_the_file(tmp_path, model, vocab, value):
    """A checkpoint with NaN or infinite weights (a diverged run) is refused with one sentence naming the file."""
    from safetensors.torch import save_file

    path = save_checkpoint(tmp_path / "m.safetensors", model, vocab)
    tensors = load_file(path)
    name = next(k for k, v in tensors.items() if v.is_floating_point())
    tensors[name][0] = value
    with safe_open(str(path), framework="pt") as handle:
        meta = handle.metadata()
    save_file(tensors, str(tmp_path / "bad.safetensors"), metadata=meta)
    with pytest.raises(ProCapError, match=f"bad.safetensors hold NaN or infinite values .*{name}"):
        load_checkpoint(tmp_path / "bad.safetensors")


def test_atomic_write_leaves_no_temp_files(tmp_path, model, vocab):
    save_checkpoint(tmp_path / "m.safetensors", model, vocab)
    save_checkpoint(tmp_path / "m.safetensors", model, vocab)  # overwrite in place
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.safetensors"]


def test_training_state_round_trip(tmp_path, model, vocab):
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-3)
    before, after = _images()
    caps = torch.tensor([vocab.encode("there is no change", max_len=12)] * 3)
    model.stage2_loss(before, after, caps)["loss"].backward()
    opt.step()
    ckpt = tmp_path / "last.safetensors"
    save_checkpoint(ckpt, model, vocab)
    save_training_state(ckpt, opt, {"step": 1, "epoch": 0, "best_metric": 0.5})
    assert all(p.exists() for p in state_paths(ckpt))

    fresh = torch.optim.AdamW(params, lr=0.0)
    scalars = load_training_state(ckpt, fresh, restore_rng=False)
    assert scalars["step"] == 1 and scalars["best_metric"] == 0.5
    assert fresh.param_groups[0]["lr"] == 1e-3 and isinstance(fresh.param_groups[0]["betas"], tuple)
    for p in params:
        for key, value in opt.state[p].items():
            assert torch.equal(value, fresh.state[p][key])


def test_rng_states_restore_every_generator():
    tensors, scalars = capture_rng_state()
    expected = (torch.rand(3), np.random.rand(3), random.random())
    restore_rng_state(tensors, scalars)
    again = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(expected[0], again[0]) and np.array_equal(expected[1], again[1]) and expected[2] == again[2]
    assert tensors["rng/torch"].dtype == torch.uint8


def test_mismatched_state_files_are_rejected(tmp_path, model, vocab):
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
    ckpt = tmp_path / "last.safetensors"
    save_training_state(ckpt, opt, {"step": 1})
    _tensor_file, json_file = state_paths(ckpt)
    old_json = json_file.read_text()
    save_training_state(ckpt, opt, {"step": 2})
    json_file.write_text(old_json)
    with pytest.raises(ProCapError, match="different saves"):
        load_training_state(ckpt, opt)
    json_file.unlink()
    with pytest.raises(ProCapError, match="does not exist"):
        load_training_state(ckpt, opt)
