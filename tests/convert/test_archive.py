"""The restricted unpickler: the authors' file loads without its classes, and no malicious payload ever runs."""

from __future__ import annotations

import os
import pickle
import zipfile

import pytest
import torch

from procap.commands.cli import main
from procap.convert.archive import AUTHORS_GLOBALS, AttrDict, OptionsNamespace, UnsafeCheckpointError, load_archive
from procap.core.errors import ProCapError
from tests.support import AUTHORS_CHECKPOINT, AUTHORS_VOCAB, PeakMemory


class _Payload:
    """Unpickling this object calls ``function(*args)``: the classic pickle exploit."""

    def __init__(self, function, *args):
        self.function, self.args = function, args

    def __reduce__(self):
        return self.function, self.args


def _marker_command(marker) -> str:
    return f"touch {marker}"


def _evil_checkpoint(path, marker, where="top"):
    """A torch.save zip shaped like the authors' checkpoint with an ``os.system`` payload at ``where``."""
    payload = _Payload(os.system, _marker_command(marker))
    obj = {"model": {"w": torch.zeros(2)}, "model_cfg": {}, "opt": None, "epoch": 0, "optimizer": {"state": {}}}
    if where == "top":
        obj["evil"] = payload
    else:  # deep inside the optimizer state, a part the converter does not even use
        obj["optimizer"]["param_groups"] = [{"lr": 0.1, "schedule": payload}]
    torch.save(obj, path)


def _zip_with_pickle(path, data: bytes) -> None:
    """A torch-style archive whose data.pkl is ``data`` (for opcodes torch.save never writes)."""
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("archive/data.pkl", data)
        archive.writestr("archive/byteorder", "little")


def test_authors_checkpoint_loads_without_their_packages():
    obj = load_archive(AUTHORS_CHECKPOINT, AUTHORS_GLOBALS)
    assert list(obj) == ["model", "model_cfg", "opt", "epoch", "optimizer"]
    assert isinstance(obj["model_cfg"], AttrDict) and obj["model_cfg"]["hidden_size"] == 128
    assert obj["model_cfg"]["vocab_size"] == 80 and obj["model_cfg"]["mask_token_id"] == 7
    assert isinstance(obj["opt"], OptionsNamespace) and obj["opt"].state["dset_name"] == "clevr"
    assert obj["model"]["text_decoder.decoder.out.weight"].shape == (80, 128)
    assert obj["model"]["intermediate_generator.target_pos_emb.weights.1"].shape == (1, 1, 14, 1, 128)
    for module in ("easydict", "ruamel", "src"):
        assert module not in __import__("sys").modules  # nothing was imported to read it


def test_torch_weights_only_refuses_the_authors_file():
    with pytest.raises(pickle.UnpicklingError):
        torch.load(AUTHORS_CHECKPOINT, weights_only=True)


@pytest.mark.parametrize("where", ["top", "optimizer"])
def test_malicious_checkpoint_is_refused_and_its_payload_never_runs(tmp_path, where):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.chkpt"
    _evil_checkpoint(path, marker, where)
    with pytest.raises(UnsafeCheckpointError, match=r"refers to (posix|os|nt)\.system"):
        load_archive(path, AUTHORS_GLOBALS, what="authors' checkpoint")
    assert not marker.exists()


@pytest.mark.parametrize("function", [exec, eval, __import__("subprocess").call, __import__, torch.load])
def test_other_callables_are_refused(tmp_path, function):
    marker = tmp_path / "pwned"
    args = {
        exec: f"open({str(marker)!r}, 'w')",
        eval: f"open({str(marker)!r}, 'w')",
        __import__: "os",
        torch.load: str(marker),
    }.get(function, ["touch", str(marker)])
    path = tmp_path / "evil.chkpt"
    torch.save({"x": _Payload(function, args)}, path)
    with pytest.raises(UnsafeCheckpointError, match="does not allow"):
        load_archive(path, AUTHORS_GLOBALS)
    assert not marker.exists()


def test_protocol_4_stack_global_is_refused(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.chkpt"
    _zip_with_pickle(path, pickle.dumps(_Payload(os.system, _marker_command(marker)), protocol=4))
    with pytest.raises(UnsafeCheckpointError):
        load_archive(path, AUTHORS_GLOBALS)
    assert not marker.exists()


def test_build_on_an_allowed_function_is_refused(tmp_path):
    # GLOBAL torch._utils _rebuild_tensor_v2 ; {"__defaults__": ...} ; BUILD: would set attributes on our function
    data = b"\x80\x02ctorch._utils\n_rebuild_tensor_v2\n}X\x04\x00\x00\x00evilK\x01sb."
    path = tmp_path / "evil.chkpt"
    _zip_with_pickle(path, data)
    with pytest.raises(UnsafeCheckpointError, match="sets the state of a function"):
        load_archive(path, AUTHORS_GLOBALS)


def test_legacy_and_garbage_files_are_refused_without_unpickling(tmp_path):
    marker = tmp_path / "pwned"
    legacy = tmp_path / "legacy.pt"
    legacy.write_bytes(pickle.dumps(_Payload(os.system, _marker_command(marker))))
    with pytest.raises(ProCapError, match="not a torch zip archive"):
        load_archive(legacy, AUTHORS_GLOBALS)
    assert not marker.exists()
    with pytest.raises(ProCapError, match="does not exist"):
        load_archive(tmp_path / "missing.chkpt", AUTHORS_GLOBALS)


def test_tensor_bounds_are_checked(tmp_path):
    path = tmp_path / "t.pt"
    torch.save({"w": torch.arange(6.0)}, path)
    assert torch.equal(load_archive(path, AUTHORS_GLOBALS)["w"], torch.arange(6.0))
    with zipfile.ZipFile(path) as archive:  # cut the storage short: the declared tensor no longer fits
        files = {name: archive.read(name) for name in archive.namelist()}
    storage = next(name for name in files if "/data/" in name and not name.endswith("serialization_id"))
    files[storage] = files[storage][:8]
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    with pytest.raises(ProCapError, match="shorter than its declared size|past the end"):
        load_archive(path, AUTHORS_GLOBALS)


def test_convert_cli_refuses_a_malicious_checkpoint(tmp_path, capsys):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.chkpt"
    _evil_checkpoint(path, marker)
    out = tmp_path / "model.safetensors"
    argv = ["convert", "--from", "authors", str(path), "--vocab", str(AUTHORS_VOCAB), "--out", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("procap: error:") and "system" in err and "\n" not in err
    assert not marker.exists() and not out.exists() and not list(tmp_path.glob(".model*"))


def test_pickle_with_allowed_names_still_cannot_call_out(tmp_path):
    # An allowed stand-in used as a callable (REDUCE) only builds the stand-in.
    data = b"\x80\x02ceasydict\nEasyDict\nX\x01\x00\x00\x00aK\x01\x86\x85\x85R."  # EasyDict(((("a", 1),),))
    path = tmp_path / "ok.chkpt"
    _zip_with_pickle(path, data)
    obj = load_archive(path, AUTHORS_GLOBALS)
    assert isinstance(obj, AttrDict) and obj == {"a": 1}


# -- sizes are bounded by the file before memory is taken -----------------------------------------------------------
SMALL_ALLOCATION = 64 * 2**20  # what a refused read may take at its peak: far below what the file asks for


def _stride_zero_checkpoint(path):
    """A ~1.4 KB authors'-shaped file whose one-element storage is a 16384 x 16384 tensor (1 GiB) by stride 0."""
    torch.save({"model": {"w": torch.zeros(1).expand(2**14, 2**14)}, "model_cfg": {}}, path)


def _zip_bomb_checkpoint(path):
    """A torch.save archive whose storage entry is re-written deflated: 256 MiB of zeros in about 250 KB of file."""
    torch.save({"model": {"w": torch.zeros(4)}}, path)
    with zipfile.ZipFile(path) as archive:
        files = {info.filename: archive.read(info) for info in archive.infolist()}
    storage = next(name for name in files if "/data/" in name and not name.endswith("serialization_id"))
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in files.items():
            if name != storage:
                archive.writestr(name, data)
                continue
            info = zipfile.ZipInfo(name)
            info.compress_type = zipfile.ZIP_DEFLATED
            with archive.open(info, "w", force_zip64=True) as stream:
                for _ in range(256):
                    stream.write(bytes(2**20))


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (_stride_zero_checkpoint, "more elements than its storage"),
        (_zip_bomb_checkpoint, "more than 16 times its size"),
    ],
    ids=["stride-0 tensor", "zip bomb"],
)
def test_a_small_file_cannot_make_the_reader_allocate_much(tmp_path, build, message):
    path = tmp_path / "model.chkpt"
    build(path)
    assert path.stat().st_size < 2**20
    with PeakMemory() as peak, pytest.raises(ProCapError, match=message):
        load_archive(path, AUTHORS_GLOBALS, what="authors' checkpoint")
    assert peak.growth < SMALL_ALLOCATION, f"the refused read took {peak.growth / 2**20:.0f} MiB at its peak"


def test_tensors_rebuilt_from_one_storage_are_bounded_by_it(tmp_path):
    # Tied weights (two tensors over one storage) load; a thousand views of one storage are refused.
    shared = torch.arange(6.0)
    path = tmp_path / "tied.pt"
    torch.save({"a": shared, "b": shared.view(2, 3)}, path)
    loaded = load_archive(path, AUTHORS_GLOBALS)
    assert torch.equal(loaded["a"], shared) and torch.equal(loaded["b"], shared.view(2, 3))
    torch.save({f"v{i}": shared.view(6) for i in range(1000)}, path)
    with pytest.raises(ProCapError, match="rebuilds more tensor data"):
        load_archive(path, AUTHORS_GLOBALS)


def test_convert_refuses_a_stride_zero_checkpoint_in_one_sentence(tmp_path, capsys):
    path = tmp_path / "model.chkpt"
    _stride_zero_checkpoint(path)
    out = tmp_path / "m.safetensors"
    with PeakMemory() as peak:
        code = main(["convert", "--from", "authors", str(path), "--vocab", str(AUTHORS_VOCAB), "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("procap: error:") and "\n" not in err and "more elements" in err
    assert peak.growth < SMALL_ALLOCATION and not out.exists()


def test_a_taming_vqgan_zip_bomb_is_refused_before_torch_reads_it(tmp_path):
    """torch.load inflates deflated entries too: the VQGAN reader checks the declared sizes first."""
    from procap.model.vqgan import load_taming_state_dict

    path = tmp_path / "vqgan.ckpt"
    _zip_bomb_checkpoint(path)
    with PeakMemory() as peak, pytest.raises(ProCapError, match="VQGAN checkpoint .* more than 16 times its size"):
        load_taming_state_dict(path)
    assert peak.growth < SMALL_ALLOCATION
