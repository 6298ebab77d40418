"""The compiled ops (``torch.ops.procap.*``): compiled from the package's own sources on first use, cached, loaded.

The wheel is pure Python and carries the C++ and CUDA sources as package data (``kernels/csrc/``, installed as
``procap/kernels/csrc/``). The first time the dispatch asks for a compiled op, :func:`load` compiles them with
``torch.utils.cpp_extension.load`` into a cache folder named by what the binary depends on (:func:`cache_key`:
torch version, Python version, device kind) and by the sources' digest, and loads the library; later processes load
the cached library directly, without a compiler or ninja. A compile at first use rather than at install, because
a library built ahead of time is bound to the exact torch it was built against, and an isolated build
(``python -m build``, a plain ``pip install`` of the sdist) does not see the user's torch at all.

* ``PROCAP_SKIP_EXT=1``: never compile or load them; the dispatch uses Triton or the PyTorch references.
* ``PROCAP_SKIP_CUDA_BUILD=1``: the C++ ops alone, even with a GPU and nvcc.
* ``PROCAP_CACHE``: the cache root (default ``$XDG_CACHE_HOME/procap``, else ``~/.cache/procap``).

When the ops cannot be had (no compiler, no ninja, a compile error, an unwritable cache) one warning says why, once
per process, and nothing raises; :func:`load_error` keeps the reason. A failed compile is recorded in its folder
(``failed.json``) so that later processes with the same compiler do not pay for it again. Processes compiling at
once are serialised by an ``flock`` on the build folder: the others wait and load the first one's library (an
flock, unlike torch's own lock file, is released when its holder is killed).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shlex
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from procap.core.errors import ProCapError
from procap.core.files import atomic_write_json, atomic_write_text
from procap.core.json_files import read_json

try:
    import fcntl
except ImportError:  # Windows: torch's own lock file alone guards a build folder there
    fcntl = None  # type: ignore[assignment]

logger = logging.getLogger(__name__)

SOURCES = Path(__file__).resolve().parent / "csrc"
LIBRARY_NAME = "procap_ops"
LIBRARY_FILE = f"{LIBRARY_NAME}.so"  # what cpp_extension names it on Linux and macOS
CXX_FLAGS = ("-O3", "-fopenmp", "-ffp-contract=off")  # no FMA contraction: the C++ ops round like the reference
NVCC_FLAGS = ("-O3",)  # no --use_fast_math: distances must round like the fp32 reference
LD_FLAGS = ("-fopenmp",)
SKIP_ENV, SKIP_CUDA_ENV, CACHE_ENV = "PROCAP_SKIP_EXT", "PROCAP_SKIP_CUDA_BUILD", "PROCAP_CACHE"
BUILT, FAILED, FAILED_LOG = "built.json", "failed.json", "failed.log"  # in each build folder
COMPILER_ERROR = re.compile(r"(^|: )(fatal )?error:", re.IGNORECASE)  # gcc's, clang's and nvcc's diagnostics


class OpsUnavailable(Exception):
    """The compiled ops cannot be had here; the message says why in a few words."""


@dataclass(frozen=True)
class BuildPlan:
    """One compile: its sources and the device kind its cache folder is named by (``cpu`` or ``cuda-sm90...``)."""

    device_kind: str
    sources: tuple[Path, ...]

    @property
    def with_cuda(self) -> bool:
        return any(source.suffix == ".cu" for source in self.sources)

    def digest(self) -> str:
        """12 hex digits over the sources' names and contents and the flags: changed sources build anew."""
        sha = hashlib.sha256(json.dumps([CXX_FLAGS, NVCC_FLAGS, LD_FLAGS]).encode())
        for source in self.sources:
            sha.update(f"\0{source.name}\0".encode())
            sha.update(source.read_bytes())
        return sha.hexdigest()[:12]

    def without_cuda(self) -> BuildPlan:
        return BuildPlan("cpu", tuple(source for source in self.sources if source.suffix != ".cu"))


def cache_root(environ: Mapping[str, str] = os.environ) -> Path:
    """``$PROCAP_CACHE``, else ``$XDG_CACHE_HOME/procap``, else ``~/.cache/procap``."""
    if environ.get(CACHE_ENV):
        return Path(environ[CACHE_ENV]).expanduser()
    return Path(environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "procap"


def cache_key(torch_version: str, python_version: tuple[int, int], device_kind: str) -> str:
    """The folder that builds for this torch, Python and device kind share, e.g. ``torch2.13.0+cpu-py3.11-cpu``.

    A compiled library is bound to one torch's C++ ABI and one Python's, so any other torch or Python build needs
    its own; the device kind keeps CPU-only builds apart from CUDA builds and those for other GPU architectures.
    """
    return f"torch{torch_version}-py{python_version[0]}.{python_version[1]}-{device_kind}"


def build_folder(plan: BuildPlan, environ: Mapping[str, str] = os.environ) -> Path:
    """Where ``plan`` is compiled for the running torch and Python."""
    key = cache_key(torch.__version__, (sys.version_info[0], sys.version_info[1]), plan.device_kind)
    return cache_root(environ) / "ext" / key / plan.digest()


def cuda_archs(environ: Mapping[str, str] = os.environ) -> str:
    """The GPU architectures a CUDA build targets, as torch picks them: ``TORCH_CUDA_ARCH_LIST``, else the visible
    GPUs'; as a folder-name part (``sm80_sm90``), because a library built for one does not run on the others."""
    listed = environ.get("TORCH_CUDA_ARCH_LIST", "").replace(";", " ").split()
    if not listed:
        listed = sorted(
            {"{}.{}".format(*torch.cuda.get_device_capability(i)) for i in range(torch.cuda.device_count())}
        )
    return "_".join("sm" + re.sub(r"[^0-9A-Za-z]", "", arch) for arch in listed)


def plan_build(environ: Mapping[str, str] = os.environ) -> BuildPlan:
    """The C++ sources, plus the CUDA ones where torch is a CUDA build, a GPU is visible and nvcc is found."""
    cpp_sources = tuple(sorted(SOURCES.glob("*.cpp")))
    if not cpp_sources:
        raise OpsUnavailable(f"this install has no C++ sources ({SOURCES} is missing or empty)")
    cuda_sources = tuple(sorted(SOURCES.glob("cuda/*.cu")))
    cpu = BuildPlan("cpu", cpp_sources)
    if environ.get(SKIP_CUDA_ENV, "0") == "1" or not cuda_sources or torch.version.cuda is None:
        return cpu
    if not torch.cuda.is_available():  # a CUDA kernel this machine cannot run is not worth a compile
        return cpu
    from torch.utils import cpp_extension  # imports setuptools: only where a CUDA build is possible

    if cpp_extension.CUDA_HOME is None:
        logger.debug("no CUDA toolkit (nvcc) found: procap compiles its C++ ops only")
        return cpu
    return BuildPlan(f"cuda-{cuda_archs(environ)}", cpp_sources + cuda_sources)


@contextlib.contextmanager
def _folder_locked(folder: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``folder``, waiting (and saying so) while another process compiles there."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                logger.info("waiting for another process compiling procap's ops in %s", folder)
                fcntl.flock(fd, fcntl.LOCK_EX)
            except OSError:  # a file system without flock: torch's lock file still guards the build
                pass
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the flock


@contextlib.contextmanager
def _ninja_on_path() -> Iterator[None]:
    """torch runs ``ninja`` from PATH; the ninja package's own binary also counts when its environment (a venv
    run by its interpreter's path) is not activated."""
    if shutil.which("ninja"):
        yield
        return
    bin_dir = ""
    with contextlib.suppress(ImportError):
        import ninja

        bin_dir = ninja.BIN_DIR
    if not bin_dir:
        raise OpsUnavailable("ninja, which torch compiles with, is not installed (pip install ninja)")
    path = os.environ.get("PATH")
    os.environ["PATH"] = os.pathsep.join(filter(None, [bin_dir, path]))
    try:
        yield
    finally:
        if path is None:
            os.environ.pop("PATH", None)
        else:
            os.environ["PATH"] = path


def _failure_reason(error: Exception, folder: Path) -> str:
    """The first compiler error line of a failed build (its whole output goes to ``failed.log`` in ``folder``)."""
    text = str(error)
    lines = [line.strip() for line in text.splitlines()[1:] if line.strip()]  # the first names the extension only
    first = next((line for line in lines if COMPILER_ERROR.search(line)), lines[-1] if lines else text.strip())
    first = " ".join(first.split())[:300] or type(error).__name__
    log = folder / FAILED_LOG
    with contextlib.suppress(OSError):
        atomic_write_text(log, text)
        return f"the compile failed: {first} (whole output in {log})"
    return f"the compile failed: {first}"


def _load_cached(library: Path) -> None:
    """Load a library an earlier run compiled into the cache."""
    try:
        torch.ops.load_library(str(library))
    except (OSError, RuntimeError) as exc:  # removed or damaged since; or another procap library loaded
        raise OpsUnavailable(
            f"the cached library {library} does not load ({' '.join(str(exc).split())[:300]}); delete "
            f"{library.parent} to compile it again"
        ) from exc


def compile_and_load(plan: BuildPlan, environ: Mapping[str, str] = os.environ) -> Path:
    """Load the library ``plan`` builds, compiling it into its cache folder first when no build is there.

    Returns:
        The loaded library's path.

    Raises:
        OpsUnavailable: why not, in a few words.
    """
    folder = build_folder(plan, environ)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OpsUnavailable(
            f"the cache folder {folder} cannot be created ({exc.strerror or exc}); set {CACHE_ENV} to a writable one"
        ) from exc
    library = folder / LIBRARY_FILE
    with _folder_locked(folder):
        if (folder / BUILT).is_file():
            _load_cached(library)
            return library
        compiler = environ.get("CXX", "c++")  # what torch compiles with
        failed: object = None
        with contextlib.suppress(ProCapError):  # none, or one that cannot be read: the compile runs (again)
            failed = read_json(folder / FAILED, "build record")
        if isinstance(failed, dict) and failed.get("compiler") == compiler:  # another compiler gets its own try
            raise OpsUnavailable(
                f"an earlier compile with {compiler} failed ({failed.get('reason')}); delete {folder} to try again"
            )
        program = shlex.split(compiler)[0] if compiler.strip() else ""
        if not program or shutil.which(program) is None:
            raise OpsUnavailable(f"no C++ compiler ({compiler!r} is not found; install one or set CXX)")
        with _ninja_on_path():
            _compile(plan, folder, compiler)
    return library


def _compile(plan: BuildPlan, folder: Path, compiler: str) -> None:
    from torch.utils import cpp_extension  # imports setuptools: only when compiling

    # Held by us now (the flock): torch's lock file or a half-linked library here is what a killed compile left.
    (folder / "lock").unlink(missing_ok=True)
    (folder / LIBRARY_FILE).unlink(missing_ok=True)
    what = "C++ and CUDA ops" if plan.with_cuda else "C++ ops"
    logger.info(
        "compiling procap's %s for torch %s into %s (once per torch, Python and device; about a minute)",
        what,
        torch.__version__,
        folder,
    )
    start = time.monotonic()
    try:
        cpp_extension.load(
            name=LIBRARY_NAME,
            sources=[str(source) for source in plan.sources],
            extra_cflags=list(CXX_FLAGS),
            extra_cuda_cflags=list(NVCC_FLAGS),
            extra_ldflags=list(LD_FLAGS),
            build_directory=str(folder),
            with_cuda=plan.with_cuda,
            is_python_module=False,  # a plain library: loading it registers torch.ops.procap
            verbose=False,
        )
    except Exception as exc:  # ninja's RuntimeError, a loader's OSError, ...: each means "not here"
        reason = _failure_reason(exc, folder)
        with contextlib.suppress(OSError):
            atomic_write_json(folder / FAILED, {"compiler": compiler, "reason": reason})
        raise OpsUnavailable(reason) from exc
    seconds = time.monotonic() - start
    with contextlib.suppress(OSError):  # loaded all the same; without the record the next process runs ninja again
        atomic_write_json(
            folder / BUILT, {"torch": torch.__version__, "compiler": compiler, "seconds": round(seconds, 1)}
        )
    logger.debug("procap's %s compiled in %.0f s", what, seconds)


def _find_and_load() -> str | None:
    """Load the ops (compiling them if need be); None, or the reason they are not there."""
    if os.environ.get(SKIP_ENV, "0") == "1":
        logger.debug("%s=1: procap's compiled ops are not loaded", SKIP_ENV)
        return f"{SKIP_ENV}=1"
    try:
        plan = plan_build()
        try:
            compile_and_load(plan)
        except OpsUnavailable as exc:
            if not plan.with_cuda:
                raise
            logger.warning("procap's CUDA ops are not used (%s); compiling its C++ ops alone", exc)
            compile_and_load(plan.without_cuda())
    except (OpsUnavailable, OSError) as exc:  # OSError: the build folder cannot be opened or locked
        logger.warning(
            "procap's compiled ops are not used: %s; procap.kernels runs Triton on CUDA where installed and the "
            "PyTorch references elsewhere (%s=1 skips this attempt).",
            exc,
            SKIP_ENV,
        )
        return str(exc)
    return None


_lock = threading.RLock()
_loaded: bool | None = None  # None until the first load()
_error: str | None = None
_registrations: list[Callable[[], None]] = []


def load() -> bool:
    """Make ``torch.ops.procap`` available, compiling it the first time; False (the reason logged once) when not.

    Called by the dispatch when it first considers a compiled op; call it directly to compile ahead of use (on a
    machine with a compiler, into a ``PROCAP_CACHE`` that others share).
    """
    global _loaded, _error
    with _lock:
        if _loaded is None:
            _error = _find_and_load()
            _loaded = _error is None
            if _loaded:
                for register in _registrations:
                    register()
        return _loaded


def load_error() -> str | None:
    """None when the compiled ops are loaded (loading them if need be), else why not."""
    load()
    return _error


def on_load(register: Callable[[], None]) -> None:
    """Run ``register`` (an op file's fake kernels and autograd) once the library is loaded: now, or when it is."""
    with _lock:
        if _loaded:
            register()
        else:
            _registrations.append(register)


def has_kernel(op: str, device_type: str) -> bool:
    """Whether ``torch.ops.procap.<op>`` has a kernel for ``device_type`` ("cpu" or "cuda"), loading the ops."""
    if not load():
        return False
    key = {"cpu": "CPU", "cuda": "CUDA"}.get(device_type)
    return key is not None and torch._C._dispatch_has_kernel_for_dispatch_key(f"procap::{op}", key)
