"""Read ``torch.save`` and TorchScript zip archives without executing their pickles.

Both formats are a zip with one root folder holding ``data.pkl`` (a pickle) and ``data/<key>`` (the raw bytes of
each tensor storage). A pickle can name any importable callable (the ``GLOBAL`` / ``STACK_GLOBAL`` opcodes) and
call it (``REDUCE``, ``NEWOBJ``, ``BUILD``): that is how a malicious checkpoint runs code when it is loaded, and
why ``torch.load(weights_only=True)`` refuses every class it does not know, including the ones the authors'
checkpoints name (``easydict``, ``ruamel.yaml``, their own ``src`` package).

:class:`RestrictedUnpickler` resolves a global only through an explicit allowlist (``(module, name)`` ->
replacement): tensors are rebuilt by our own function from the archive's bytes, a few plain containers are
allowed, and every other allowed name maps to an inert stand-in class of ours that just keeps its pickled
state. Nothing is imported by name and no pickled callable ever runs. Anything not on the list is refused with
one sentence (:class:`UnsafeCheckpointError`), and so is a ``BUILD`` whose target is not a stand-in instance (it
could otherwise set attributes on our own functions or classes).

Every size the archive states is bounded before memory is taken for it, so a small file cannot make the reader
allocate much more than the file holds: the entries together may expand to at most
:data:`procap.core.weights.MAX_EXPANSION` times the archive's size (``torch.save`` stores entries uncompressed; a deflated
zip bomb declares far more), a tensor may hold no more elements than its storage (only overlapping strides, such as
stride 0, could), and the tensors rebuilt from the storages may take at most :data:`MAX_REBUILT_PER_STORED` times
the bytes of the storages read (tied weights rebuild one storage twice).
"""

from __future__ import annotations

import collections
import math
import pickle
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar

import torch

from procap.core.errors import ProCapError
from procap.core.weights import check_zip_expansion


class UnsafeCheckpointError(ProCapError):
    """The archive's pickle names a global outside the allowlist (or misuses an allowed one)."""


# Bytes of rebuilt tensors over bytes of storages read: a storage is rebuilt once per tensor viewing it.
MAX_REBUILT_PER_STORED = 4


# --------------------------------------------------------------------------------------------------- stand-ins
class StandIn:
    """An instance of a class we refuse to import: it only keeps the state its pickle gave it (``state``)."""

    pickled_class = "?"
    args: tuple = ()
    state: Any = None  # set by the pickle's BUILD (NEWOBJ creates instances without calling __init__)

    def __init__(self, *args: Any) -> None:
        self.args = args

    def __setstate__(self, state: Any) -> None:
        self.state = state

    def __repr__(self) -> str:
        return f"<stand-in for {self.pickled_class}>"


class AttrDict(dict):
    """Stand-in for ``easydict.EasyDict`` and ruamel's ``CommentedMap``: a plain dict (attributes are dropped)."""

    def __setstate__(self, state: Any) -> None:
        if isinstance(state, dict):  # EasyDict pickles its attributes, which mirror its items
            for key, value in state.items():
                self.setdefault(key, value)


class OptionsNamespace(StandIn):
    """Stand-in for ``argparse.Namespace``: its attributes are in ``state`` (a dict)."""

    pickled_class = "argparse.Namespace"


class YamlList(list):
    """Stand-in for ruamel's ``CommentedSeq`` (comment and format attributes dropped)."""

    def __setstate__(self, state: Any) -> None:
        pass


class YamlFloat(float):
    """Stand-in for ruamel's ``ScalarFloat`` (formatting attributes dropped)."""

    def __setstate__(self, state: Any) -> None:
        pass


class YamlInt(int):
    """Stand-in for ruamel's ``ScalarInt`` family and ``ScalarBoolean``."""

    def __setstate__(self, state: Any) -> None:
        pass


class YamlStr(str):
    """Stand-in for ruamel's ``ScalarString`` family."""

    def __setstate__(self, state: Any) -> None:
        pass


def _stand_in(module: str, name: str) -> type[StandIn]:
    """A fresh inert class for ``module.name`` (its name is kept for messages and for TorchScript modules)."""
    return type(name, (StandIn,), {"pickled_class": f"{module}.{name}", "__module__": __name__})


# --------------------------------------------------------------------------------------------------- tensors
_STORAGE_DTYPES = {
    "DoubleStorage": torch.float64,
    "FloatStorage": torch.float32,
    "HalfStorage": torch.float16,
    "BFloat16Storage": torch.bfloat16,
    "LongStorage": torch.int64,
    "IntStorage": torch.int32,
    "ShortStorage": torch.int16,
    "CharStorage": torch.int8,
    "ByteStorage": torch.uint8,
    "BoolStorage": torch.bool,
    "UntypedStorage": torch.uint8,
}


class _StorageType:
    """What ``torch.FloatStorage`` & co. resolve to: only the dtype they stand for."""

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype


class _Storage:
    """A storage of the archive: ``data`` is a 1-D tensor over its bytes, read once; ``budget`` is shared by every
    storage of one archive and pays for the tensors rebuilt from them."""

    def __init__(self, data: torch.Tensor, budget: _RebuildBudget) -> None:
        self.data, self.budget = data, budget


class _RebuildBudget:
    """Bytes the tensors rebuilt from one archive may still take (:data:`MAX_REBUILT_PER_STORED` per byte read)."""

    def __init__(self, source: str) -> None:
        self.source, self.left = source, 0

    def earn(self, stored_bytes: int) -> None:
        self.left += MAX_REBUILT_PER_STORED * stored_bytes

    def spend(self, rebuilt_bytes: int) -> None:
        if rebuilt_bytes > self.left:
            raise UnsafeCheckpointError(
                f"{self.source} rebuilds more tensor data than {MAX_REBUILT_PER_STORED} times its storages hold; "
                "the file is malformed"
            )
        self.left -= rebuilt_bytes


def _rebuild_tensor(storage: Any, offset: Any, size: Any, stride: Any, *_ignored: Any) -> torch.Tensor:
    """Our replacement for ``torch._utils._rebuild_tensor_v2``: a tensor copied out of an archive storage.

    Arguments are checked (types and bounds) because they come from the untrusted pickle. ``requires_grad``,
    backward hooks and metadata are ignored.
    """
    if not isinstance(storage, _Storage) or not isinstance(offset, int):
        raise UnsafeCheckpointError("a tensor in the archive is rebuilt from something other than a storage")
    if not (
        isinstance(size, tuple)
        and isinstance(stride, tuple)
        and len(size) == len(stride)
        and all(isinstance(v, int) and v >= 0 for v in size + stride)
    ):
        raise UnsafeCheckpointError(f"a tensor in the archive has an invalid size {size!r} or stride {stride!r}")
    extent = offset + sum((n - 1) * s for n, s in zip(size, stride)) + 1 if all(size) else offset
    if offset < 0 or extent > storage.data.numel():
        raise UnsafeCheckpointError("a tensor in the archive reaches past the end of its storage")
    numel = math.prod(size)
    if numel > storage.data.numel():  # overlapping strides (stride 0): a small storage would fill a large tensor
        raise UnsafeCheckpointError(
            f"a tensor in the archive of size {size} has more elements than its storage ({storage.data.numel()})"
        )
    storage.budget.spend(numel * storage.data.element_size())
    out = torch.empty(size, dtype=storage.data.dtype)
    if out.numel():
        out.copy_(storage.data.as_strided(size, stride, offset))
    return out


def _rebuild_parameter(data: Any, *_ignored: Any) -> torch.Tensor:
    """Replacement for ``torch._utils._rebuild_parameter``: the tensor itself."""
    if not isinstance(data, torch.Tensor):
        raise UnsafeCheckpointError("a parameter in the archive does not wrap a tensor")
    return data


def _codecs_encode(text: Any, encoding: str = "utf-8") -> bytes:
    """Replacement for ``_codecs.encode``, which protocol-2 pickles use for bytes: only str -> latin-1 bytes."""
    if not isinstance(text, str) or encoding != "latin1":
        raise UnsafeCheckpointError("the archive encodes bytes in an unexpected way")
    return text.encode("latin1")


def _ordered_dict(*args: Any) -> collections.OrderedDict:
    return collections.OrderedDict(*args)


def _typed_list(items: Any, *_ignored: Any) -> Any:
    """Replacement for ``torch.jit._pickle`` list builders and ``restore_type_tag``: the value unchanged."""
    return items


# --------------------------------------------------------------------------------------------------- allowlists
TENSOR_GLOBALS: dict[tuple[str, str], Any] = {
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("collections", "OrderedDict"): _ordered_dict,
    ("_codecs", "encode"): _codecs_encode,
    **{("torch", name): _StorageType(dtype) for name, dtype in _STORAGE_DTYPES.items()},
}

_RUAMEL = "ruamel.yaml."
# Every class the authors' YAML loader can leave in their options, by ruamel module; the set in a file depends on
# the ruamel version.
_RUAMEL_CLASSES: dict[str, dict[str, type | None]] = {
    "scalarfloat": {"ScalarFloat": YamlFloat, "ExponentialFloat": YamlFloat, "ExponentialCapsFloat": YamlFloat},
    "scalarint": {n: YamlInt for n in ("ScalarInt", "BinaryInt", "OctalInt", "HexInt", "HexCapsInt", "DecimalInt")},
    "scalarbool": {"ScalarBoolean": YamlInt},
    "scalarstring": {
        n: YamlStr
        for n in (
            "ScalarString",
            "LiteralScalarString",
            "FoldedScalarString",
            "SingleQuotedScalarString",
            "DoubleQuotedScalarString",
            "PlainScalarString",
            "PreservedScalarString",
        )
    },
    "comments": {
        "CommentedSeq": YamlList,
        "CommentedMap": AttrDict,
        "CommentedOrderedMap": AttrDict,
        **{n: None for n in ("Comment", "Format", "LineCol", "Tag")},
    },
    "tokens": {"CommentToken": None},
    "error": {"CommentMark": None, "StreamMark": None, "StringMark": None, "FileMark": None},
    "anchor": {"Anchor": None},
    "tag": {"Tag": None},
}
_AUTHORS_SCHEDULES = (
    "WarmupLinearSchedule",
    "WarmupCosineSchedule",
    "WarmupConstantSchedule",
    "ConstantLR",
    "WarmupCosineWithHardRestartsSchedule",
    "WarmupCosineWithWarmupRestartsSchedule",
    "_LRSchedule",
)


def _authors_globals() -> dict[tuple[str, str], Any]:
    table: dict[tuple[str, str], Any] = dict(TENSOR_GLOBALS)
    table[("argparse", "Namespace")] = OptionsNamespace
    table[("easydict", "EasyDict")] = AttrDict
    for module, classes in _RUAMEL_CLASSES.items():
        for name, stand_in in classes.items():
            table[(_RUAMEL + module, name)] = stand_in or _stand_in(_RUAMEL + module, name)
    for name in _AUTHORS_SCHEDULES:  # BertAdam's learning-rate schedule objects, inside the optimizer state
        table[("src.rtransformer.optimization", name)] = _stand_in("src.rtransformer.optimization", name)
    return table


AUTHORS_GLOBALS = _authors_globals()
TORCHSCRIPT_GLOBALS: dict[tuple[str, str], Any] = {
    **TENSOR_GLOBALS,
    **{
        ("torch.jit._pickle", name): _typed_list
        for name in ("build_intlist", "build_doublelist", "build_boollist", "build_tensorlist", "restore_type_tag")
    },
}
_SAFE_BUILD_TARGETS = (StandIn, AttrDict, YamlList, YamlFloat, YamlInt, YamlStr, collections.OrderedDict)


class ScriptModule(StandIn):
    """Stand-in for a TorchScript module object (``__torch__.*``): its attributes are in ``state`` (a dict)."""

    pickled_class = "__torch__"


# --------------------------------------------------------------------------------------------------- unpickler
class RestrictedUnpickler(pickle._Unpickler):  # the pure-Python unpickler: its BUILD opcode can be replaced
    """Unpickle with an explicit allowlist of globals; storages are read from the archive.

    Args:
        file: the ``data.pkl`` stream.
        allowed: ``(module, name) -> replacement`` table (:data:`AUTHORS_GLOBALS`, :data:`TORCHSCRIPT_GLOBALS`).
        storage: ``key -> bytes`` reader for ``data/<key>``.
        source: the archive path, for messages.
        torchscript: also map every ``__torch__.*`` class (TorchScript module types) to :class:`ScriptModule`.
    """

    dispatch: ClassVar[dict[int, Callable]] = dict(pickle._Unpickler.dispatch)
    stack: list[Any]  # the pure-Python unpickler's value stack, set by load(); typeshed declares only its dispatch

    def __init__(
        self,
        file: Any,
        allowed: Mapping[tuple[str, str], Any],
        storage: Callable[[str], bytes],
        source: str,
        torchscript: bool = False,
    ) -> None:
        super().__init__(file)
        self.allowed, self.storage, self.source, self.torchscript = allowed, storage, source, torchscript
        self._storages: dict[str, _Storage] = {}
        self._budget = _RebuildBudget(source)

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in self.allowed:
            return self.allowed[(module, name)]
        if self.torchscript and (module == "__torch__" or module.startswith("__torch__.")):
            return ScriptModule
        raise UnsafeCheckpointError(
            f"{self.source} refers to {module}.{name}, which the safe loader does not allow (its pickle could run "
            f"code); if you trust the file, re-save only its tensors with torch.save"
        )

    def persistent_load(self, pid: Any) -> _Storage:
        if not (
            isinstance(pid, tuple)
            and len(pid) == 5
            and pid[0] == "storage"
            and isinstance(pid[1], _StorageType)
            and isinstance(pid[2], str)
        ):
            raise UnsafeCheckpointError(f"{self.source} has a persistent id that is not a tensor storage")
        dtype, key, numel = pid[1].dtype, pid[2], pid[4]
        if key not in self._storages:
            raw = self.storage(key)
            item = torch.empty((), dtype=dtype).element_size()
            if len(raw) % item or (isinstance(numel, int) and dtype != torch.uint8 and len(raw) // item < numel):
                raise UnsafeCheckpointError(f"{self.source}: storage {key} is shorter than its declared size")
            data = torch.frombuffer(bytearray(raw), dtype=dtype) if raw else torch.empty(0, dtype=dtype)
            self._budget.earn(len(raw))
            self._storages[key] = _Storage(data, self._budget)
        return self._storages[key]

    def _load_build(self) -> None:
        target = self.stack[-2]  # the state is on top, the object it is for below it
        if not isinstance(target, _SAFE_BUILD_TARGETS):
            raise UnsafeCheckpointError(
                f"{self.source} sets the state of a {type(target).__name__}, which the safe loader does not allow"
            )
        # typeshed stubs pickle._Unpickler's public methods and dispatch only; load_build, its BUILD opcode, exists
        pickle._Unpickler.load_build(self)  # type: ignore[attr-defined]

    dispatch[pickle.BUILD[0]] = _load_build


# What a malformed (not malicious) pickle raises from the unpickler or from the stand-ins' constructors.
_MALFORMED = (
    pickle.UnpicklingError,
    EOFError,
    ValueError,
    TypeError,
    KeyError,
    IndexError,
    AttributeError,
    OverflowError,
    RuntimeError,
    UnicodeDecodeError,
    zipfile.BadZipFile,
)


def _archive_root(names: list[str], path: Path) -> str:
    roots = sorted({n.split("/", 1)[0] for n in names if n.count("/") == 1 and n.endswith("/data.pkl")})
    if len(roots) != 1:
        raise ProCapError(f"{path} is not a torch.save / TorchScript zip archive (found {len(roots)} data.pkl files)")
    return roots[0]


def _zip_archive(path: str | Path, what: str) -> Path:
    """``path`` when it is a zip file (the format of torch >= 1.6), else one sentence naming it as ``what``."""
    path = Path(path)
    if not path.is_file():
        raise ProCapError(f"{what} {path} does not exist")
    if not zipfile.is_zipfile(path):
        raise ProCapError(
            f"{what} {path} is not a torch zip archive (a legacy torch.save file or not a torch file); "
            f"re-save it with torch >= 1.6"
        )
    return path


def load_archive(
    path: str | Path, allowed: Mapping[tuple[str, str], Any], torchscript: bool = False, what: str = "checkpoint"
) -> Any:
    """Unpickle ``data.pkl`` of a torch zip archive with :class:`RestrictedUnpickler`.

    Args:
        path: a ``torch.save`` file (zip format, torch >= 1.6) or a TorchScript archive.
        allowed: the allowlist of globals.
        torchscript: accept TorchScript module classes (``__torch__.*``) as :class:`ScriptModule` stand-ins.
        what: how messages name the file.

    Returns:
        The unpickled object, with tensors as CPU tensors and unknown-but-allowed classes as stand-ins.

    Raises:
        UnsafeCheckpointError: the pickle names a global outside ``allowed``.
        ProCapError: the file is missing, not a zip archive, big-endian or malformed.
    """
    path = _zip_archive(path, what)
    with zipfile.ZipFile(path) as archive:
        root = _archive_root(archive.namelist(), path)
        names = set(archive.namelist())
        check_zip_expansion(archive, path, what)
        if f"{root}/byteorder" in names and archive.read(f"{root}/byteorder").strip() != b"little":
            raise ProCapError(f"{what} {path} was written on a big-endian machine, which the safe loader does not read")

        def storage(key: str) -> bytes:
            name = f"{root}/data/{key}"
            if name not in names:
                raise ProCapError(f"{what} {path} lacks the storage {name}")
            return archive.read(name)

        with archive.open(f"{root}/data.pkl") as stream:
            unpickler = RestrictedUnpickler(stream, allowed, storage, f"{what} {path}", torchscript)
            try:
                return unpickler.load()
            except ProCapError:
                raise
            except _MALFORMED as exc:
                raise ProCapError(
                    f"{what} {path} could not be unpickled safely ({type(exc).__name__}: {str(exc)[:120]})"
                ) from None
