"""``save_pretrained`` / ``from_pretrained`` / ``push_to_hub`` on :class:`~procap.model.procap.ProCap` (the Hugging Face
habit), kept out of the model file: each method is one call into :mod:`procap.hub`."""

from __future__ import annotations

from pathlib import Path
from typing import Any


class PretrainedMixin:
    """Hub-style saving and loading; the files and their rules are :mod:`procap.hub`'s."""

    def save_pretrained(self, directory: str | Path, vocab: Any = None, **card: Any) -> Path:
        """Write ``config.json``, ``model.safetensors``, ``vocab.json`` and a model card ``README.md``.

        ``vocab`` defaults to ``self.vocab`` (set by :meth:`from_pretrained`); ``card`` takes ``dataset``,
        ``metrics``, ``license``, ``repo_id`` (see :func:`procap.hub.save_pretrained`).
        """
        from procap.hub import save_pretrained

        return save_pretrained(self, directory, vocab, **card)

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str | Path,
        revision: str | None = None,
        cache_dir: str | Path | None = None,
        local_files_only: bool = False,
        map_location: Any = "cpu",
    ) -> Any:
        """A model from a pretrained folder, a checkpoint file, ``hf://owner/repo[@rev]`` or ``owner/repo``.

        Returns the model in eval mode, with its vocabulary as ``model.vocab``.
        """
        from procap.hub import load_pretrained

        model, _, _ = load_pretrained(name_or_path, revision, cache_dir, local_files_only, map_location)
        return model

    def push_to_hub(self, repo_id: str, vocab: Any = None, **options: Any) -> str:
        """Upload as a pretrained folder to the Hub repo ``repo_id``; see :func:`procap.hub.push_to_hub`."""
        from procap.hub import push_to_hub

        return push_to_hub(self, repo_id, vocab, **options)
