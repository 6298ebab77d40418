"""Procedure generation (stage-1 data): interpolation, confidence scores, keyframe sampling, the HDF5 cache."""

from procap.procedure.interpolate import (
    CrossFade,
    FlowInterpolator,
    Interpolator,
    generate_procedure,
)

__all__ = ["CrossFade", "FlowInterpolator", "Interpolator", "generate_procedure"]
