"""Importers for checkpoints written by other code: the authors' ProCap models and CLIP encoders.

Nothing here executes pickled code: ``torch.save`` / TorchScript archives go through the restricted unpickler of
:mod:`procap.convert.archive`.
"""

from procap.convert.archive import UnsafeCheckpointError, load_archive
from procap.convert.authors import convert_authors_checkpoint, read_authors_checkpoint
from procap.convert.clip import init_encoder_from_clip, load_clip_blocks

__all__ = [
    "UnsafeCheckpointError",
    "convert_authors_checkpoint",
    "init_encoder_from_clip",
    "load_archive",
    "load_clip_blocks",
    "read_authors_checkpoint",
]
