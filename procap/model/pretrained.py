"""Pretrained models the Hugging Face way: a folder (or Hub repo) of ``config.json``, ``model.safetensors``,
``vocab.json`` and a model card ``README.md``; ``ProCap.save_pretrained`` / ``from_pretrained`` / ``push_to_hub``.

``model.safetensors`` is a complete procap checkpoint (:func:`procap.model.checkpoint_file.save_checkpoint`: the
config and the vocabulary ride in its metadata), so every command that takes a checkpoint file also takes the folder
or ``hf://owner/repo[@revision]``; ``config.json`` and ``vocab.json`` are its readable copies for the Hub's pages
and for people, and loading checks that ``config.json`` agrees with the weights.

:class:`~procap.model.procap.ProCap` inherits :class:`PretrainedMixin`. Nothing here names ``ProCap``: writing is
handed the model, reading the class to build (the ``cls`` of ``from_pretrained``), and files travel through
:mod:`procap.core.hub_files` (level 0), so the model reaches all of it downwards. :func:`procap.loading.hub.load_pretrained` is
:func:`read_pretrained` with ``ProCap`` named.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from procap.core import validate
from procap.core.config import ProCapConfig, nest_groups
from procap.core.errors import ProCapError
from procap.core.extras import DISTRIBUTION
from procap.core.files import UNIT_COMMITTED, atomic_write_json, atomic_write_text, beside, commit_unit
from procap.core.hub_files import (
    CARD_NAME,
    CONFIG_NAME,
    VOCAB_NAME,
    WEIGHTS_NAME,
    PretrainedSource,
    is_repo_id_shape,
    push_folder,
)
from procap.core.json_files import read_json
from procap.data import DATASETS, Vocabulary
from procap.data.domain import describe_domain, read_domain
from procap.model.checkpoint_file import CheckpointedModel, ModelT, read_checkpoint, save_checkpoint

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self is Python 3.11+; annotations only, so no runtime dependency

PAPER_TITLE = "Imagine How To Change: Explicit Procedure Modeling for Change Captioning"
PAPER_VENUE = "ICLR 2026"
# The README's citation block is this text (tests/test_project_files.py keeps them equal). No author field: the
# authors' names appear nowhere in this repository, and a guessed list would be worse than none.
PAPER_BIBTEX = """@inproceedings{procap2026imagine,
  title     = {Imagine How To Change: Explicit Procedure Modeling for Change Captioning},
  booktitle = {International Conference on Learning Representations (ICLR)},
  year      = {2026}
}"""
# Where the paper's authors publish their checkpoints (the repo `procap convert` reads from).
AUTHORS_HUB_URL = "https://huggingface.co/BlueberryOreo/ProCap"
# The model card's last section.
CARD_CITATION = (
    "## Citation",
    "",
    "The method is the paper's; its authors are not named in procap's sources, so the entry gives title and venue:",
    "",
    "```bibtex",
    PAPER_BIBTEX,
    "```",
)
# config.json keys that are not ProCapConfig fields: what the Hub's pages read to name the library and model.
# a pretrained folder's files, in the order a save moves them into place
PRETRAINED_FILES = (WEIGHTS_NAME, CONFIG_NAME, VOCAB_NAME, CARD_NAME)
_CONFIG_TAGS = {"library_name": "procap", "model_type": "procap", "architectures": ["ProCap"]}


def write_pretrained(
    model: CheckpointedModel,
    directory: str | Path,
    vocab: Vocabulary | None = None,
    *,
    dataset: str | None = None,
    metrics: dict[str, float] | None = None,
    license: str | None = None,
    repo_id: str | None = None,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Write ``model`` as a pretrained folder: ``config.json``, ``model.safetensors``, ``vocab.json``, ``README.md``.

    Args:
        model: a :class:`procap.model.procap.ProCap`.
        directory: the folder (created; files already there are replaced).
        vocab: its :class:`procap.data.Vocabulary` (default: ``model.vocab``, set by ``from_pretrained``).
        dataset: the training data, for the model card (e.g. ``"clevr-change"``; default: the one recorded with
            the weights, their ``trained_on`` record included).
        metrics: measured scores for the card, e.g. ``{"CIDEr": 112.3}`` (default: those recorded with the model).
        license: the card's licence field (a Hub licence id); default ``mit`` for weights trained with procap and
            ``other`` for the authors' converted weights (:func:`card_license`).
        repo_id: the Hub repo the folder is meant for; the card's examples name it.
        extra: more JSON facts kept in the weights' metadata.

    Returns:
        The folder.
    """
    vocab = vocab if vocab is not None else getattr(model, "vocab", None)
    if vocab is None:
        raise ProCapError("save_pretrained needs the model's vocabulary: pass vocab=... (a procap Vocabulary).")
    directory = validate.output_dir(directory, "save_pretrained folder")
    info = _saved_info(model, dataset, metrics, license, extra)
    card = model_card(model, len(vocab), info, repo_id)

    def write(staging: Path) -> None:
        save_checkpoint(staging / WEIGHTS_NAME, model, vocab, info)
        atomic_write_json(staging / CONFIG_NAME, {**_CONFIG_TAGS, **model.config.to_dict()})
        vocab.save(staging / VOCAB_NAME)
        atomic_write_text(staging / CARD_NAME, card)

    # one unit: four independent writes left new weights under the old model card when killed between them; other
    # files in the folder (a Hub clone's .git, say) stay, which a swap of the whole folder would not leave them
    commit_unit(directory / WEIGHTS_NAME, PRETRAINED_FILES, write)
    return directory


def _saved_info(
    model: CheckpointedModel,
    dataset: str | None,
    metrics: dict[str, float] | None,
    license: str | None,
    extra: dict[str, Any] | None,
) -> dict[str, Any]:
    """What a save keeps with the weights: what they record already, ``extra``, and the card's facts (each the
    one asked for, else the recorded one), the licence as :func:`card_license` settles it."""
    recorded = dict(getattr(model, "pretrained_info", {}) or {})
    info = {
        **recorded,
        **(extra or {}),
        "dataset": dataset if dataset is not None else recorded.get("dataset") or _recorded_dataset(recorded),
        "metrics": metrics if metrics is not None else recorded.get("metrics", {}),
        "license": license or recorded.get("license"),
    }
    info["license"] = card_license(model, info)
    return info


def _recorded_dataset(info: dict[str, Any]) -> str | None:
    """The loader name the ``trained_on`` record of the weights holds, if any."""
    record = read_domain(info)
    return record["dataset"] if record else None


def converted_from_authors(model: CheckpointedModel, info: dict[str, Any]) -> bool:
    """True for weights the paper's authors trained (``procap convert --from authors``), whatever saved them since."""
    return model.config.authors.enabled or info.get("converted_from") == "authors"


def card_license(model: CheckpointedModel, info: dict[str, Any]) -> str:
    """The card's licence id: the one asked for, else MIT for weights trained with procap and ``other`` for the
    authors' converted weights, whose terms are theirs to set and are not procap's."""
    if info.get("license"):
        return str(info["license"])
    return "other" if converted_from_authors(model, info) else "mit"


def _training_data(dataset: str | None, info: dict[str, Any]) -> list[str]:
    """The card's section on the training data: the benchmark's usual name when procap knows the dataset, and the
    ``trained_on`` record of the weights (:mod:`procap.data.domain`) with what it means for other images."""
    spec = DATASETS.get(dataset) if dataset else None
    named = f"{spec.title} (procap's loader `{dataset}`)." if spec else (f"{dataset}." if dataset else "")
    record = read_domain(info)
    if record is None:  # weights from before the record, or a model never trained by procap
        return [named or "Not recorded."]
    source = record["source_image_size"]
    rows = [
        ("dataset", record["title"]),
        ("loader", f"`{record['dataset']}`" if record["dataset"] else "not recorded"),
        ("synthetic scenes", {True: "yes (`procap synth`)", False: "no", None: "not recorded"}[record["synthetic"]]),
        # the folder's name only: the full path stays in the weights' metadata, not on a public page
        ("dataset folder", f"`{Path(record['data']).name}`" if record["data"] else "not recorded"),
        ("training images", f"{source[0]} x {source[1]} px" if source else "not recorded"),
        ("model input", f"{record['image_size']} px" if record["image_size"] else "not recorded"),
        ("preset", f"`{record['preset']}`" if record["preset"] else "not recorded"),
    ]
    lines = [named, ""] if named else []
    lines += ["| trained on | |", "| --- | --- |", *(f"| {key} | {value} |" for key, value in rows), ""]
    if record["synthetic"]:
        lines.append(
            "These weights know synthetic scenes only: on photographs or images of another size their captions are "
            "guesses, and `procap caption` / `Captioner` warn (`OutOfDomainWarning`) when given such images."
        )
    else:
        lines.append(
            "`procap caption` / `Captioner` warn (`OutOfDomainWarning`) when given images far from these "
            f"({describe_domain(record)})."
        )
    return lines


def model_card(model: CheckpointedModel, vocab_size: int, info: dict[str, Any], repo_id: str | None = None) -> str:
    """The ``README.md`` of a pretrained folder: Hub metadata, architecture, training data, scores, usage, licence,
    citation.

    The front matter holds only what the Hub's fields mean: ``datasets`` lists a dataset only when it is a Hub
    dataset id (``owner/name``), since procap's loader names (``clevr-change``) are not; a licence of ``other``
    (the authors' converted weights) comes with the ``license_name`` and ``license_link`` the Hub asks for.
    ``library_name: procap`` is not a library the Hub knows (none it knows loads these folders, and naming one would
    show a snippet that fails; docs/pretrained.md), so the usage snippet is the card's own, which
    ``tests/test_hub.py`` runs as written; it also reads the card back through ``huggingface_hub.ModelCard``.
    """
    dataset = info.get("dataset")
    metrics = {k: v for k, v in (info.get("metrics") or {}).items() if isinstance(v, (int, float))}
    license_id = card_license(model, info)
    authors_weights = converted_from_authors(model, info)
    lines = [
        *_card_front_matter(license_id, authors_weights, dataset),
        "",
        *_card_architecture(model, vocab_size),
        "",
        "## Training data",
        "",
        *_training_data(dataset, info),
        "",
        *_card_scores(metrics),
        "",
        *_card_usage(repo_id),
        "",
        *_card_licence(license_id, authors_weights),
        "",
        *CARD_CITATION,
        "",
    ]
    return "\n".join(lines)


def _card_front_matter(license_id: str, authors_weights: bool, dataset: Any) -> list[str]:
    """The card's YAML front matter: licence (with the Hub's name and link for ``other``), library, tags, and the
    dataset when it is a Hub dataset id."""
    front = ["---", f"license: {license_id}"]
    if license_id == "other" and authors_weights:
        front += ["license_name: procap-authors-weights", f"license_link: {AUTHORS_HUB_URL}"]
    front += ["library_name: procap", "pipeline_tag: image-to-text", "tags:", "- change-captioning", "- procap"]
    if dataset and is_repo_id_shape(str(dataset)):
        front += ["datasets:", f"- {dataset}"]
    front.append("---")
    return front


def _card_architecture(model: CheckpointedModel, vocab_size: int) -> list[str]:
    """The card's title, what the model does, and its architecture table."""
    c = model.config
    total = sum(p.numel() for p in model.parameters())
    vqgan = sum(p.numel() for p in model.get_submodule("vqgan").parameters())
    latents = f"{c.latent_size} x {c.latent_size} VQGAN latents"
    merge = c.departures.token_merge
    if merge > 1:
        latents += f", merged {merge} x {merge} into {c.grid_size} x {c.grid_size} encoder tokens"
    return [
        f"# ProCap change captioner ({c.name} preset, {'authors' if c.authors.enabled else 'procap'} variant)",
        "",
        'Describes in words what changed between two images ("the small red cube moved"): the implicit',
        f"procedure captioner of *{PAPER_TITLE}* ({PAPER_VENUE}), saved with the `{DISTRIBUTION}` library",
        "(`import procap`).",
        "",
        "## Architecture",
        "",
        "| part | size |",
        "| --- | --- |",
        f"| images | {c.image_size} px, {latents} |",
        f"| procedure queries | k = {c.num_keyframes} frames between before and after |",
        f"| procedure encoder | {c.enc_layers} layers x {c.enc_dim} |",
        f"| caption decoder | {c.dec_layers} layers x {c.dec_dim}, captions up to {c.max_caption_len} tokens |",
        f"| vocabulary | {vocab_size} entries |",
        f"| parameters | {total:,} (VQGAN {vqgan:,}) |",
    ]


def _card_scores(metrics: dict[str, int | float]) -> list[str]:
    """The card's "Measured scores": a table of the numeric ``metrics``, or a line saying none were recorded."""
    lines = ["## Measured scores", ""]
    if metrics:
        lines += ["| metric | value |", "| --- | --- |"]
        lines += [f"| {name} | {value:.4g} |" for name, value in metrics.items()]
    else:
        lines.append("Not recorded with these weights.")
    return lines


def _card_usage(repo_id: str | None) -> list[str]:
    """The card's "How to caption": the command and the Python lines, naming ``repo_id`` when there is one."""
    where = f"hf://{repo_id}" if repo_id else "path/to/this/folder"
    source = repo_id or "path/to/this/folder"
    return [
        "## How to caption",
        "",
        # No pip line: the distribution is not known to be on PyPI, and a command that fails is worse than none.
        f"With procap installed (the `{DISTRIBUTION}` distribution, with its `[hub]` extra for Hub repos):",
        "",
        "```bash",
        f"procap caption --ckpt {where} before.png after.png",
        "```",
        "",
        "```python",
        "from procap.fast import Captioner",
        "",
        f'captioner = Captioner.from_pretrained("{source}")',
        'captioner.caption("before.png", "after.png")',
        "```",
    ]


def _card_licence(license_id: str, authors_weights: bool) -> list[str]:
    """The card's licence section: the authors' terms for their converted weights, else the licence id."""
    lines = ["## Licence", ""]
    if authors_weights:
        lines += [
            "These weights were trained by the paper's authors and converted to this format by procap; they remain",
            f"theirs and come under their terms (their checkpoints: {AUTHORS_HUB_URL}), not under procap's MIT",
            f"licence, which covers the procap code only. Licence field: `{license_id}`.",
        ]
    else:
        lines.append(f"`{license_id}`.")
    return lines


def read_pretrained(
    model_class: Callable[[ProCapConfig], ModelT],
    source: PretrainedSource,
    map_location: str | torch.device = "cpu",
) -> tuple[ModelT, Vocabulary, dict[str, Any]]:
    """``(model, vocab, metadata)`` from a :class:`~procap.core.hub_files.PretrainedSource`: a pretrained folder,
    a checkpoint file, ``hf://...`` or ``owner/repo``.

    The model is in eval mode on ``map_location`` and carries ``model.vocab`` and ``model.pretrained_info`` (what
    the weights record: dataset, metrics...), so ``model.save_pretrained(folder)`` needs nothing else.
    """
    weights = source.resolve()
    if beside(weights, UNIT_COMMITTED).is_dir():
        raise ProCapError(
            f"{weights.parent} holds a save_pretrained that was stopped while its files were moved into place, so "
            "they may be of two saves; save the model into it again (that finishes or replaces the save)."
        )
    model, vocab, metadata = read_checkpoint(model_class, weights, map_location)
    _check_config_copy(weights.parent / CONFIG_NAME, model.config.to_dict())
    model.vocab = vocab
    model.pretrained_info = metadata.get("extra", {})
    return model, vocab, metadata


def _check_config_copy(path: Path, config: dict[str, Any]) -> None:
    """A ``config.json`` beside the weights must describe them (a hand-edited copy would otherwise mislead)."""
    if not path.is_file():
        return
    copy = read_json(path, "model config")
    if not isinstance(copy, dict):
        raise ProCapError(f"{path} does not hold a JSON object.")
    # a folder saved before the departures or the authors' variant were grouped names them at the top level:
    # compare them grouped
    try:
        fields = nest_groups({key: value for key, value in copy.items() if key not in _CONFIG_TAGS})
    except ValueError as exc:  # an older file's variant that is none
        raise ProCapError(f"{path}: {exc}.") from None
    # JSON turns tuples into lists: compare both as JSON text.
    if json.dumps(fields, sort_keys=True) != json.dumps(config, sort_keys=True):
        differing = sorted(key for key in set(fields) | set(config) if fields.get(key) != config.get(key))
        raise ProCapError(
            f"{path} differs from the config stored in {WEIGHTS_NAME} beside it (e.g. {', '.join(differing[:3])}); "
            f"the weights' own config is the one they fit."
        )


class PretrainedMixin(CheckpointedModel):
    """Hub-style saving and loading of a torch module built from a :class:`~procap.core.config.ProCapConfig` (its
    ``config``); the files and their rules are this module's."""

    def save_pretrained(self, directory: str | Path, vocab: Vocabulary | None = None, **card: Any) -> Path:
        """Write ``config.json``, ``model.safetensors``, ``vocab.json`` and a model card ``README.md``.

        ``vocab`` defaults to ``self.vocab`` (set by :meth:`from_pretrained`); ``card`` takes ``dataset``,
        ``metrics``, ``license``, ``repo_id``, ``extra`` (see :func:`write_pretrained`).
        """
        return write_pretrained(self, directory, vocab, **card)

    @classmethod
    def from_pretrained(
        cls, name_or_path: str | Path, *, map_location: str | torch.device = "cpu", **source: Any
    ) -> Self:
        """A model from a pretrained folder, a checkpoint file, ``hf://owner/repo[@rev]`` or ``owner/repo``.

        ``source``: the keyword arguments of :class:`~procap.core.hub_files.PretrainedSource` (``revision``,
        ``cache_dir``, ``local_files_only``, ``token``, ``force_download``). Returns the model in eval mode on
        ``map_location``, with its vocabulary as ``model.vocab``.
        """
        model, _, _ = read_pretrained(cls, PretrainedSource(name_or_path, **source), map_location)
        return model

    def push_to_hub(
        self,
        repo_id: str,
        vocab: Vocabulary | None = None,
        *,
        private: bool | None = None,
        token: str | None = None,
        revision: str | None = None,
        commit_message: str = "Upload ProCap model",
        **card: Any,
    ) -> str:
        """Save as a pretrained folder and upload it to the Hub repo ``repo_id`` (created when missing).

        Args:
            repo_id: ``owner/name``.
            vocab: as for :meth:`save_pretrained`; ``card`` takes its ``dataset``, ``metrics``, ``license``.
            private, token, revision, commit_message: passed to ``huggingface_hub``.

        Returns:
            The URL of the commit.
        """
        return push_folder(
            repo_id,
            lambda folder: write_pretrained(self, folder, vocab, repo_id=repo_id, **card),
            private=private,
            token=token,
            revision=revision,
            commit_message=commit_message,
        )
