"""Entry points for ``torch.hub.load``: a pretrained ProCap model or its fast captioner from a pretrained folder,
a ``.safetensors`` checkpoint, ``hf://owner/repo[@revision]`` or ``owner/repo``.

    model = torch.hub.load("path/to/procap", "procap", "hf://you/procap-clevr", source="local")
    captioner = torch.hub.load("path/to/procap", "captioner", "path/to/pretrained-folder", source="local")

torch.hub puts this folder on ``sys.path`` before importing the file, so ``procap`` is importable from a plain clone.
Names starting with an underscore are not entry points.
"""

from __future__ import annotations

# torch.hub checks these are importable before it calls an entry point. huggingface_hub is left out: a local folder
# or checkpoint file needs only the core, and a Hub name without it is one sentence naming the [hub] extra.
dependencies = ["torch", "numpy", "PIL", "safetensors"]


def procap(name_or_path: str, **options):
    """A ``ProCap`` in eval mode with its vocabulary as ``model.vocab``; ``options`` are those of
    ``ProCap.from_pretrained``: ``map_location`` and the fields of ``procap.core.hub_files.PretrainedSource``
    (``revision``, ``cache_dir``, ``local_files_only``, ``token``, ``force_download``)."""
    from procap.model.procap import ProCap

    return ProCap.from_pretrained(name_or_path, **options)


def captioner(name_or_path: str, **options):
    """A ``procap.fast.Captioner`` (bf16 and CUDA graphs on a GPU); ``options`` are those of
    ``Captioner.from_pretrained``: the Captioner's and the fields of ``procap.core.hub_files.PretrainedSource``."""
    from procap.fast import Captioner

    return Captioner.from_pretrained(name_or_path, **options)
