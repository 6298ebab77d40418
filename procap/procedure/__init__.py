"""Procedure generation (stage-1 data): interpolation, confidence scores, keyframe sampling, the HDF5 cache.

See docs/procedures.md. Heavy optional pieces (timm for DINOv2) are imported only when used.
"""

from procap.procedure.cache import CachedProcedures, CacheWriter, ProcedureCache, authors_key
from procap.procedure.explicit import explicit_captions, explicit_frames, explicit_memory
from procap.procedure.interpolate import (
    CrossFade,
    FlowInterpolator,
    Interpolator,
    backward_warp,
    forward_splat,
    generate_procedure,
)
from procap.procedure.sampling import confidence_weights, sample_keyframes
from procap.procedure.similarity import (
    DINOv2Similarity,
    ScoreFileSimilarity,
    Similarity,
    VQGANSimilarity,
)

__all__ = [
    "CacheWriter",
    "CachedProcedures",
    "CrossFade",
    "DINOv2Similarity",
    "FlowInterpolator",
    "Interpolator",
    "ProcedureCache",
    "ScoreFileSimilarity",
    "Similarity",
    "VQGANSimilarity",
    "authors_key",
    "backward_warp",
    "confidence_weights",
    "explicit_captions",
    "explicit_frames",
    "explicit_memory",
    "forward_splat",
    "generate_procedure",
    "sample_keyframes",
]
