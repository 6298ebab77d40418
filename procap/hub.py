"""Pretrained models the Hugging Face way: a folder (or Hub repo) of ``config.json``, ``model.safetensors``,
``vocab.json`` and a model card ``README.md``.

``model.safetensors`` is a complete procap checkpoint (:func:`procap.checkpoint.save_checkpoint`: the config and the
vocabulary ride in its metadata), so every command that takes a checkpoint file also takes the folder or
``hf://owner/repo[@revision]``; ``config.json`` and ``vocab.json`` are its readable copies for the Hub's pages and
for people, and loading checks that ``config.json`` agrees with the weights.

Where a checkpoint can come from (:func:`resolve_checkpoint`):

- a ``.safetensors`` file;
- a folder written by :func:`save_pretrained` (its ``model.safetensors``);
- ``hf://owner/repo[@revision]`` (a snapshot of the repo's pretrained files) or
  ``hf://owner/repo[@revision]/path/in/repo`` (one file, e.g. the authors' ``.chkpt`` for ``procap convert``);
- in :func:`load_pretrained` also a bare repo id ``owner/repo``, as ``from_pretrained`` takes everywhere.

Downloads go through ``huggingface_hub`` (the optional ``[hub]`` extra) into its cache; with ``HF_HUB_OFFLINE=1``
or ``local_files_only=True`` only the cache is read, and a file missing there is one sentence, not a download.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from procap import validate
from procap.checkpoint import load_checkpoint, save_checkpoint
from procap.errors import ProCapError
from procap.extras import DISTRIBUTION, require
from procap.files import atomic_write_json, atomic_write_text
from procap.model.procap import count_parameters

if TYPE_CHECKING:
    from procap.data import Vocabulary
    from procap.model.procap import ProCap

HF_PREFIX = "hf://"
WEIGHTS_NAME = "model.safetensors"
CONFIG_NAME = "config.json"
VOCAB_NAME = "vocab.json"
CARD_NAME = "README.md"
PRETRAINED_FILES = (CONFIG_NAME, WEIGHTS_NAME, VOCAB_NAME, CARD_NAME)
_PYPI_PAGE = f"https://pypi.org/project/{DISTRIBUTION}/"
# config.json keys that are not ProCapConfig fields: what the Hub's pages read to name the library and model.
_CONFIG_TAGS = {"library_name": "procap", "model_type": "procap", "architectures": ["ProCap"]}
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


def is_repo_id(value: str) -> bool:
    """``owner/repo`` that is not an existing local path (a relative folder ``runs/x`` that exists stays local)."""
    return bool(_REPO_ID.match(str(value))) and not Path(value).exists()


def hub_offline() -> bool:
    """True when ``HF_HUB_OFFLINE`` asks for the cache only (read at every call, not once at import)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def download(
    hub: HubPath,
    what: str = "checkpoint",
    cache_dir: str | Path | None = None,
    local_files_only: bool = False,
) -> Path:
    """The local path of a Hub file, or of a snapshot folder of a repo's pretrained files, from the cache or
    downloaded into it.

    Raises:
        ProCapError: ``huggingface_hub`` missing (names the ``[hub]`` extra), the repo, revision or file not found,
            not cached while offline, or the download failed.
    """
    hf = require("huggingface_hub", f"{what} {hub}")
    errors = require("huggingface_hub.errors", f"{what} {hub}")  # a lazy submodule: not an attribute until imported
    offline = local_files_only or hub_offline()
    # Read at each call (huggingface_hub reads it once, at import), so a cache named later still counts.
    cache_dir = cache_dir or os.environ.get("HF_HUB_CACHE") or None
    common: dict[str, Any] = {"revision": hub.revision, "cache_dir": cache_dir, "local_files_only": offline}
    try:
        if hub.filename:
            return Path(hf.hf_hub_download(hub.repo_id, hub.filename, **common))
        return Path(hf.snapshot_download(hub.repo_id, allow_patterns=list(PRETRAINED_FILES), **common))
    except errors.LocalEntryNotFoundError:
        where = f" ({cache_dir})" if cache_dir else ""
        raise ProCapError(
            f"{what} {hub} is not in the local Hugging Face cache{where} and downloads are off "
            f"(HF_HUB_OFFLINE=1 or local_files_only); download it once with network access."
        ) from None
    except errors.RevisionNotFoundError:
        raise ProCapError(f"{what} {hub}: the repo has no revision {hub.revision!r}.") from None
    except errors.RepositoryNotFoundError:
        raise ProCapError(f"{what} {hub}: no such Hugging Face repo (or it is private: log in first).") from None
    except errors.EntryNotFoundError:
        raise ProCapError(f"{what} {hub}: the repo has no file {hub.filename!r}.") from None
    except (errors.HfHubHTTPError, OSError, ValueError) as exc:
        raise ProCapError(f"{what} {hub} could not be fetched ({exc}).") from None


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
    hub = parse_hub_path(str(value), what)
    if hub is None:
        return validate.input_file(value, what)
    if not hub.filename:
        raise ProCapError(f"{what} {value} names a repo, not a file in it: add the file's path after the repo.")
    return download(hub, what, cache_dir)


def resolve_checkpoint(
    value: str | Path,
    what: str = "--ckpt",
    revision: str | None = None,
    cache_dir: str | Path | None = None,
    local_files_only: bool = False,
    allow_repo_id: bool = False,
) -> Path:
    """The local ``.safetensors`` file behind a checkpoint argument (see the module docstring for the forms).

    Args:
        value: a file, a pretrained folder, ``hf://owner/repo[@revision][/file]``, or (``allow_repo_id``)
            ``owner/repo``.
        what: how messages name the argument.
        revision: Hub revision when ``value`` names none.
        cache_dir, local_files_only: passed to the Hub download.
        allow_repo_id: accept a bare ``owner/repo`` (``from_pretrained``); the CLI asks for ``hf://``.
    """
    hub = parse_hub_path(str(value), what)
    if hub is None and allow_repo_id and is_repo_id(str(value)):
        hub = HubPath(str(value))
    if hub is not None:
        if revision and not hub.revision:
            hub = HubPath(hub.repo_id, revision, hub.filename)
        local = download(hub, what, cache_dir, local_files_only)
        return weights_in_folder(local, what) if local.is_dir() else local
    path = Path(value)
    if path.is_dir():
        return weights_in_folder(path, what)
    if allow_repo_id and not path.exists():
        raise ProCapError(
            f"{what} {value} is neither an existing file or folder nor a Hugging Face repo id (owner/repo)."
        )
    return validate.input_file(path, what)


# ----------------------------------------------------------------------------------------------- saving
def save_pretrained(
    model: ProCap,
    directory: str | Path,
    vocab: Vocabulary | None = None,
    *,
    dataset: str | None = None,
    metrics: dict[str, float] | None = None,
    license: str = "mit",
    repo_id: str | None = None,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Write ``model`` as a pretrained folder: ``config.json``, ``model.safetensors``, ``vocab.json``, ``README.md``.

    Args:
        model: a :class:`procap.model.procap.ProCap`.
        directory: the folder (created; files already there are replaced).
        vocab: its :class:`procap.data.Vocabulary` (default: ``model.vocab``, set by ``from_pretrained``).
        dataset: the training data, for the model card (e.g. ``"clevr-change"``).
        metrics: measured scores for the card, e.g. ``{"CIDEr": 112.3}`` (default: those recorded with the model).
        license: the card's licence field (an SPDX-style id).
        repo_id: the Hub repo the folder is meant for; the card's examples name it.
        extra: more JSON facts kept in the weights' metadata.

    Returns:
        The folder.
    """
    vocab = vocab if vocab is not None else getattr(model, "vocab", None)
    if vocab is None:
        raise ProCapError("save_pretrained needs the model's vocabulary: pass vocab=... (a procap Vocabulary).")
    directory = validate.output_dir(directory, "save_pretrained folder")
    recorded = dict(getattr(model, "pretrained_info", {}) or {})
    info = {
        **recorded,
        **(extra or {}),
        "dataset": dataset if dataset is not None else recorded.get("dataset"),
        "metrics": metrics if metrics is not None else recorded.get("metrics", {}),
        "license": license,
    }
    save_checkpoint(directory / WEIGHTS_NAME, model, vocab, info)
    atomic_write_json(directory / CONFIG_NAME, {**_CONFIG_TAGS, **model.config.to_dict()})
    vocab.save(directory / VOCAB_NAME)
    atomic_write_text(directory / CARD_NAME, model_card(model, len(vocab), info, repo_id))
    return directory


def model_card(model: ProCap, vocab_size: int, info: dict[str, Any], repo_id: str | None = None) -> str:
    """The ``README.md`` of a pretrained folder: Hub metadata, architecture, training data, scores, usage, licence."""
    c = model.config
    counts = count_parameters(model)
    dataset = info.get("dataset")
    metrics = {k: v for k, v in (info.get("metrics") or {}).items() if isinstance(v, (int, float))}
    where = f"hf://{repo_id}" if repo_id else "path/to/this/folder"
    source = repo_id or "path/to/this/folder"
    front = ["---", f"license: {info.get('license', 'mit')}", "library_name: procap", "pipeline_tag: image-to-text"]
    front += ["tags:", "- change-captioning", "- procap"]
    if dataset:
        front += ["datasets:", f"- {dataset}"]
    front.append("---")
    lines = [
        *front,
        "",
        f"# ProCap change captioner ({c.name} preset, {c.variant} variant)",
        "",
        'Describes in words what changed between two images ("the small red cube moved"): the implicit',
        f"procedure captioner of *Imagine How To Change* (ICLR 2026), trained with [procap]({_PYPI_PAGE}).",
        "",
        "## Architecture",
        "",
        "| part | size |",
        "| --- | --- |",
        f"| images | {c.image_size} px, {c.grid_size} x {c.grid_size} VQGAN latents |",
        f"| procedure queries | k = {c.num_keyframes} frames between before and after |",
        f"| procedure encoder | {c.enc_layers} layers x {c.enc_dim} |",
        f"| caption decoder | {c.dec_layers} layers x {c.dec_dim}, captions up to {c.max_caption_len} tokens |",
        f"| vocabulary | {vocab_size} entries |",
        f"| parameters | {counts['total']:,} (VQGAN {counts['vqgan']:,}) |",
        "",
        "## Training data",
        "",
        f"{dataset if dataset else 'Not recorded.'}",
        "",
        "## Measured scores",
        "",
    ]
    if metrics:
        lines += ["| metric | value |", "| --- | --- |"]
        lines += [f"| {name} | {value:.4g} |" for name, value in metrics.items()]
    else:
        lines.append("Not recorded with these weights.")
    lines += [
        "",
        "## How to caption",
        "",
        "```bash",
        f"pip install '{DISTRIBUTION}[hub]'",
        f"procap caption --ckpt {where} before.png after.png",
        "```",
        "",
        "```python",
        "from procap.fast import Captioner",
        "",
        f'captioner = Captioner.from_pretrained("{source}")',
        'captioner.caption("before.png", "after.png")',
        "```",
        "",
        "## Licence",
        "",
        f"{info.get('license', 'mit')}",
        "",
    ]
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------- loading
def load_pretrained(
    name_or_path: str | Path,
    revision: str | None = None,
    cache_dir: str | Path | None = None,
    local_files_only: bool = False,
    map_location: Any = "cpu",
) -> tuple[Any, Any, dict[str, Any]]:
    """``(model, vocab, metadata)`` from a pretrained folder, a checkpoint file, ``hf://...`` or ``owner/repo``.

    The model is in eval mode on ``map_location`` and carries ``model.vocab`` and ``model.pretrained_info`` (what
    the weights record: dataset, metrics...), so ``model.save_pretrained(folder)`` needs nothing else.
    """
    weights = resolve_checkpoint(
        name_or_path, "pretrained model", revision, cache_dir, local_files_only, allow_repo_id=True
    )
    model, vocab, metadata = load_checkpoint(weights, map_location=map_location)
    _check_config_copy(weights.parent / CONFIG_NAME, model.config.to_dict())
    model.vocab = vocab
    model.pretrained_info = metadata.get("extra", {})
    return model, vocab, metadata


def _check_config_copy(path: Path, config: dict[str, Any]) -> None:
    """A ``config.json`` beside the weights must describe them (a hand-edited copy would otherwise mislead)."""
    if not path.is_file():
        return
    try:
        copy = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProCapError(f"{path} is not readable JSON ({exc}).") from None
    if not isinstance(copy, dict):
        raise ProCapError(f"{path} does not hold a JSON object.")
    fields = {key: value for key, value in copy.items() if key not in _CONFIG_TAGS}
    # JSON turns tuples into lists: compare both through JSON.
    if json.loads(json.dumps(fields)) != json.loads(json.dumps(config)):
        differing = sorted(key for key in set(fields) | set(config) if fields.get(key) != config.get(key))
        raise ProCapError(
            f"{path} differs from the config stored in {WEIGHTS_NAME} beside it (e.g. {', '.join(differing[:3])}); "
            f"the weights' own config is the one they fit."
        )


# ----------------------------------------------------------------------------------------------- pushing
def push_to_hub(
    model: ProCap,
    repo_id: str,
    vocab: Vocabulary | None = None,
    *,
    private: bool | None = None,
    token: str | None = None,
    revision: str | None = None,
    commit_message: str = "Upload ProCap model",
    **card: Any,
) -> str:
    """Save ``model`` as a pretrained folder and upload it to the Hub repo ``repo_id`` (created when missing).

    Args:
        model, vocab: as for :func:`save_pretrained`; ``card`` takes its ``dataset``, ``metrics``, ``license``.
        repo_id: ``owner/name``.
        private, token, revision, commit_message: passed to ``huggingface_hub``.

    Returns:
        The URL of the commit.
    """
    if not _REPO_ID.match(repo_id):
        raise ProCapError(f"push_to_hub: {repo_id!r} is not a Hugging Face repo id (owner/name).")
    hf = require("huggingface_hub", "push_to_hub")
    errors = require("huggingface_hub.errors", "push_to_hub")
    api = hf.HfApi(token=token)
    with tempfile.TemporaryDirectory() as tmp:
        folder = save_pretrained(model, tmp, vocab, repo_id=repo_id, **card)
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
