"""Fast inference: ``Captioner`` (bf16, static KV cache, CUDA-graph decoding). See docs/fast.md."""

from procap.fast.captioner import Captioner

__all__ = ["Captioner"]
