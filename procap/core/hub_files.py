"""Where a model's files come from and go to: a local file or folder, ``hf://owner/repo[@revision][/file]``, the
Hugging Face cache, a Hub repo to upload to.

Where a checkpoint can come from (:func:`resolve_checkpoint`):

- a ``.safetensors`` file;
- a pretrained folder (its ``model.safetensors``; the folder is :mod:`procap.model.pretrained`'s);
- ``hf://owner/repo[@revision]`` (a snapshot of the repo's pretrained files) or
  ``hf://owner/repo[@revision]/path/in/repo`` (one file, e.g. the authors' ``.chkpt`` for ``procap convert``);
- with ``allow_repo_id`` also a bare repo id ``owner/repo``, as ``from_pretrained`` takes everywhere.

Downloads go through ``huggingface_hub`` (the optional ``[hub]`` extra) into its cache; with ``HF_HUB_OFFLINE=1``
or ``local_files_only=True`` only the cache is read, and a file missing there is one sentence, not a download.

Nothing here knows the model, only the file names of a pretrained folder, so this sits at level 0: the model's
``from_pretrained`` and ``push_to_hub`` reach it downwards.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from procap.core import validate
from procap.core.errors import ProCapError
from procap.core.extras import DISTRIBUTION, require

HF_PREFIX = "hf://"
MIN_HUB_VERSION = (0, 25)  # pyproject's [hub] extra says the same
WEIGHTS_NAME = "model.safetensors"
CONFIG_NAME = "config.json"
VOCAB_NAME = "vocab.json"
CARD_NAME = "README.md"
PRETRAINED_FILES = (CONFIG_NAME, WEIGHTS_NAME, VOCAB_NAME, CARD_NAME)
_NAME = r"[A-Za-z0-9][A-Za-z0-9._-]*"
_REPO_ID = re.compile(rf"^{_NAME}/{_NAME}$")
_HUB_PATH = re.compile(rf"^(?P<repo>{_NAME}/{_NAME})(?:@(?P<revision>[^/]+))?(?:/(?P<file>.+))?$")


@dataclass(frozen=True)
class HubPath:
    """A parsed ``hf://owner/repo[@revision][/path/in/repo]``."""

    repo_id: str
    revision: str | None = None
    filename: str | None = None

    def __str__(self) -> str:
        revision = f"@{self.revision}" if self.revision else ""
        filename = f"/{self.filename}" if self.filename else ""
        return f"{HF_PREFIX}{self.repo_id}{revision}{filename}"


def parse_hub_path(value: str, what: str = "path") -> HubPath | None:
    """``HubPath`` of an ``hf://`` string, None for anything else (a local path).

    Raises:
        ProCapError: ``value`` starts with ``hf://`` but is not ``hf://owner/repo[@revision][/file]``.
    """
    if not str(value).startswith(HF_PREFIX):
        return None
    match = _HUB_PATH.match(str(value)[len(HF_PREFIX) :])
    if match is None:
        raise ProCapError(f"{what} {value} is not a Hub path of the form hf://owner/repo[@revision][/file/in/repo].")
    return HubPath(match["repo"], match["revision"], match["file"])


def is_repo_id_shape(value: str) -> bool:
    """``owner/name`` as the Hub spells repo and dataset ids, whether or not a local path of that name exists."""
    return bool(_REPO_ID.match(str(value)))


def is_repo_id(value: str) -> bool:
    """``owner/repo`` that is not an existing local path (a relative folder ``runs/x`` that exists stays local)."""
    return is_repo_id_shape(value) and not Path(value).exists()


def _version_tuple(version: str) -> tuple[int, ...]:
    """The leading numbers of a version string: ``"0.24.7"`` -> ``(0, 24, 7)``, ``"1.0.0rc1"`` -> ``(1, 0)``."""
    numbers = []
    for part in version.split("."):
        digits = re.match(r"\d+", part)
        if digits is None:
            break
        numbers.append(int(digits[0]))
        if digits[0] != part:
            break
    return tuple(numbers)


def hub_client(purpose: str) -> tuple[ModuleType, ModuleType]:
    """``huggingface_hub`` and its ``errors`` module, or one sentence naming the ``[hub]`` extra.

    Before 0.25 there is no ``huggingface_hub.errors``, and the error classes this module catches would not exist
    (every Hub failure used to surface as an AttributeError), so an older release is named as such.
    """
    hf = require("huggingface_hub", purpose)
    installed = str(getattr(hf, "__version__", "0"))
    if _version_tuple(installed) < MIN_HUB_VERSION:
        wanted = ".".join(map(str, MIN_HUB_VERSION))
        raise ProCapError(
            f"{purpose} needs huggingface_hub >= {wanted} (installed: {installed}), from the [hub] extra: "
            f"pip install -U '{DISTRIBUTION}[hub]'."
        )
    return hf, require("huggingface_hub.errors", purpose)  # a lazy submodule: not an attribute until imported


def hub_offline() -> bool:
    """True when ``HF_HUB_OFFLINE`` asks for the cache only (read at every call, not once at import)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def download(
    hub: HubPath,
    what: str = "checkpoint",
    cache_dir: str | os.PathLike | None = None,
    local_files_only: bool = False,
    *,
    token: str | bool | None = None,
    force_download: bool = False,
) -> Path:
    """The local path of a Hub file, or of a snapshot folder of a repo's pretrained files, from the cache or
    downloaded into it.

    ``token`` reads a private or gated repo (default: the login's, or ``HF_TOKEN``); ``force_download`` fetches the
    files again even when the cache holds them (a cache damaged by hand). Offline, the cache is all there is, so
    ``force_download`` is refused rather than ignored.

    Raises:
        ProCapError: ``huggingface_hub`` missing (names the ``[hub]`` extra), the repo, revision or file not found,
            not cached while offline, or the download failed.
    """
    hf, errors = hub_client(f"{what} {hub}")
    offline = local_files_only or hub_offline()
    if force_download and offline:
        raise ProCapError(
            f"{what} {hub}: force_download asks for a fresh download, but downloads are off "
            f"(HF_HUB_OFFLINE=1 or local_files_only)."
        )
    # Read at each call (huggingface_hub reads it once, at import), so a cache named later still counts.
    cache_dir = cache_dir or os.environ.get("HF_HUB_CACHE") or None
    common: dict[str, Any] = {"revision": hub.revision, "cache_dir": cache_dir, "local_files_only": offline}
    common |= {"token": token, "force_download": force_download}
    try:
        if hub.filename:
            return Path(hf.hf_hub_download(hub.repo_id, hub.filename, **common))
        return Path(hf.snapshot_download(hub.repo_id, allow_patterns=list(PRETRAINED_FILES), **common))
    except (errors.EntryNotFoundError, errors.HfHubHTTPError, OSError, ValueError) as exc:
        raise _download_failure(exc, errors, f"{what} {hub}", hub, cache_dir) from None


def _download_failure(
    exc: Exception, errors: ModuleType, named: str, hub: HubPath, cache_dir: str | os.PathLike | None
) -> ProCapError:
    """The sentence for a failed :func:`download`, the most specific cause first (``errors`` is
    ``huggingface_hub.errors``, whose not-found errors are HTTP errors or OSErrors too; ``named`` says what failed)."""
    if isinstance(exc, errors.LocalEntryNotFoundError):
        where = f" ({cache_dir})" if cache_dir else ""
        return ProCapError(
            f"{named} is not in the local Hugging Face cache{where} and downloads are off "
            f"(HF_HUB_OFFLINE=1 or local_files_only); download it once with network access."
        )
    if isinstance(exc, errors.RevisionNotFoundError):
        return ProCapError(f"{named}: the repo has no revision {hub.revision!r}.")
    if isinstance(exc, errors.RepositoryNotFoundError):
        return ProCapError(f"{named}: no such Hugging Face repo (or it is private: log in first).")
    if isinstance(exc, errors.EntryNotFoundError):
        return ProCapError(f"{named}: the repo has no file {hub.filename!r}.")
    return ProCapError(f"{named} could not be fetched ({exc}).")


def as_text(value: str | os.PathLike) -> str:
    """A path argument as text: any ``os.PathLike`` (not only pathlib's) by its ``__fspath__``, whose ``str`` may
    be a repr that names no file."""
    return os.fsdecode(value) if isinstance(value, (os.PathLike, bytes)) else str(value)


def weights_in_folder(folder: Path, what: str) -> Path:
    """``folder/model.safetensors``, with one sentence when the folder holds none."""
    weights = folder / WEIGHTS_NAME
    if not weights.is_file():
        raise ProCapError(f"{what} folder {folder} holds no {WEIGHTS_NAME} (write one with ProCap.save_pretrained).")
    return weights


def resolve_file(value: str | Path, what: str, cache_dir: str | Path | None = None) -> Path:
    """A local file, or an ``hf://owner/repo[@revision]/path`` file fetched through the cache.

    Used for inputs that are single files (the authors' ``.chkpt`` and ``word2idx`` JSON of ``procap convert``).
    """
    value = as_text(value)
    hub = parse_hub_path(value, what)
    if hub is None:
        return validate.input_file(value, what)
    if not hub.filename:
        raise ProCapError(f"{what} {value} names a repo, not a file in it: add the file's path after the repo.")
    return download(hub, what, cache_dir)


@dataclass(frozen=True)
class PretrainedSource:
    """Where a pretrained model comes from: the one argument list of ``ProCap.from_pretrained``,
    ``Captioner.from_pretrained``, :func:`procap.loading.hub.load_pretrained` and the ``torch.hub`` entry points
    (which take these fields as keyword arguments, :meth:`split` sorting them from the rest), so that the four
    cannot drift apart.

    Attributes:
        name_or_path: a pretrained folder, a ``.safetensors`` checkpoint, ``hf://owner/repo[@revision]`` or
            ``owner/repo``.
        revision: the Hub revision (branch, tag or commit).
        cache_dir: the Hub cache folder (default: the Hub's).
        local_files_only: read the Hub cache only (as ``HF_HUB_OFFLINE=1``).
        token: a private or gated repo's token (default: the saved login or ``HF_TOKEN``).
        force_download: fetch again what the Hub cache holds.
    """

    name_or_path: str | os.PathLike
    revision: str | None = None
    cache_dir: str | os.PathLike | None = None
    local_files_only: bool = False
    token: str | bool | None = None
    force_download: bool = False

    @classmethod
    def split(cls, name_or_path: str | os.PathLike, options: dict[str, Any]) -> tuple[PretrainedSource, dict[str, Any]]:
        """The source named by ``name_or_path`` and the fields among ``options``, and the options left over."""
        fields = {f.name for f in dataclasses.fields(cls)} - {"name_or_path"}
        source = cls(name_or_path, **{key: value for key, value in options.items() if key in fields})
        return source, {key: value for key, value in options.items() if key not in fields}

    def resolve(self, what: str = "pretrained model") -> Path:
        """The local ``.safetensors`` file behind the source (downloaded when it is on the Hub)."""
        return resolve_checkpoint(
            self.name_or_path,
            what,
            self.revision,
            self.cache_dir,
            self.local_files_only,
            allow_repo_id=True,
            token=self.token,
            force_download=self.force_download,
        )


def resolve_checkpoint(
    value: str | os.PathLike,
    what: str = "--ckpt",
    revision: str | None = None,
    cache_dir: str | os.PathLike | None = None,
    local_files_only: bool = False,
    allow_repo_id: bool = False,
    *,
    token: str | bool | None = None,
    force_download: bool = False,
) -> Path:
    """The local ``.safetensors`` file behind a checkpoint argument (see the module docstring for the forms).

    Args:
        value: a file, a pretrained folder, ``hf://owner/repo[@revision][/file]``, or (``allow_repo_id``)
            ``owner/repo``.
        what: how messages name the argument.
        revision: Hub revision when ``value`` names none.
        cache_dir, local_files_only, token, force_download: passed to the Hub download (:func:`download`).
        allow_repo_id: accept a bare ``owner/repo`` (``from_pretrained``); the CLI asks for ``hf://`` and says so
            when given a bare repo id that is no local path.
    """
    value = as_text(value)
    hub = parse_hub_path(value, what)
    if hub is None and allow_repo_id and is_repo_id(value):
        hub = HubPath(str(value))
    if hub is not None:
        if revision and not hub.revision:
            hub = HubPath(hub.repo_id, revision, hub.filename)
        local = download(hub, what, cache_dir, local_files_only, token=token, force_download=force_download)
        return weights_in_folder(local, what) if local.is_dir() else local
    path = Path(value)
    if path.is_dir():
        return weights_in_folder(path, what)
    if allow_repo_id and not path.exists():
        raise ProCapError(
            f"{what} {value} is neither an existing file or folder nor a Hugging Face repo id (owner/repo)."
        )
    _hint_hub_prefix(value, what)
    return validate.input_file(path, what)


def _hint_hub_prefix(value: str | Path, what: str) -> None:
    """A missing ``owner/repo``-shaped path may be meant for the Hub: say how to write that.

    The command line does not guess: a ``runs/best`` not written yet would otherwise become a network request."""
    if is_repo_id(str(value)):
        raise ProCapError(f"{what} {value} does not exist here; if it names a Hugging Face repo, write hf://{value}.")


def push_folder(
    repo_id: str,
    write: Callable[[Path], Path],
    *,
    private: bool | None = None,
    token: str | None = None,
    revision: str | None = None,
    commit_message: str = "Upload ProCap model",
) -> str:
    """Upload the pretrained files that ``write(folder)`` puts in a temporary folder to the Hub repo ``repo_id``
    (created when missing).

    The repo id and ``huggingface_hub`` are checked before ``write`` runs, so a call that cannot upload saves nothing.

    Args:
        repo_id: ``owner/name``.
        write: writes the files into the folder it is given and returns the folder holding them.
        private, token, revision, commit_message: passed to ``huggingface_hub``.

    Returns:
        The URL of the commit.
    """
    if not _REPO_ID.match(repo_id):
        raise ProCapError(f"push_to_hub: {repo_id!r} is not a Hugging Face repo id (owner/name).")
    hf, errors = hub_client("push_to_hub")
    api = hf.HfApi(token=token)
    with tempfile.TemporaryDirectory() as tmp:
        folder = write(Path(tmp))
        try:
            api.create_repo(repo_id, private=private, exist_ok=True)
            info = api.upload_folder(
                repo_id=repo_id,
                folder_path=str(folder),
                revision=revision,
                commit_message=commit_message,
                allow_patterns=list(PRETRAINED_FILES),
            )
        except (errors.HfHubHTTPError, OSError, ValueError) as exc:
            raise ProCapError(f"push_to_hub to {repo_id} failed ({exc}).") from None
    return str(getattr(info, "commit_url", info))
