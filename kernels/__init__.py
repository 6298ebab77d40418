"""Fused ops, imported as ``procap.kernels``: one file per op, one small dispatch.

Each op file (``masking.py``, ``vq.py``, ``groupnorm.py``, ``conv_in.py``, ``residual.py``, ``layernorm.py``,
``greedy.py``, ``logits_pick.py``, ``split_k_attention.py``, ``linear_gelu.py``, ``decode_mlp.py``) holds the op's
whole story: its contract, the plain PyTorch reference,
the Triton kernels with their launchers and autograd, and the Python registration of the compiled op from csrc/
(compiled on first use by ``_ext.py``).
``dispatch.py`` picks an implementation once per input kind (compiled op -> Triton -> reference by device, dtype
and ``impl=`` / ``PROCAP_KERNELS``) and warns once when it falls back; :func:`chosen_impl` tells which ran.
Nothing here imports ``procap.model``: the model imports the kernels, never the reverse.

Adding an op: one ``kernels/<op>.py`` (registering a ``FusedOp``), one ``csrc/<op>_cpu.cpp`` (plus its schema in
``csrc/module.cpp``, both under ``kernels/``) and one export line below; docs/architecture.md lists the steps.
"""

from procap.kernels.conv_in import conv_in_norm, conv_in_norm_ref
from procap.kernels.decode_mlp import decode_mlp, decode_mlp_ref, decode_mlp_workspace
from procap.kernels.dispatch import IMPLS, chosen_impl, reset_dispatch
from procap.kernels.greedy import greedy_step, greedy_step_ref
from procap.kernels.groupnorm import group_norm, group_norm_ref
from procap.kernels.layernorm import add_layer_norm, add_layer_norm_ref
from procap.kernels.linear_gelu import linear_gelu, linear_gelu_ref
from procap.kernels.logits_pick import greedy_logits_step, greedy_logits_step_ref
from procap.kernels.masking import MaskParams, masking, masking_ref
from procap.kernels.residual import bias_add, bias_add_ref
from procap.kernels.split_k_attention import decode_attention, decode_attention_ref
from procap.kernels.vq import vq_nearest, vq_nearest_ref

__all__ = [
    "IMPLS",
    "MaskParams",
    "add_layer_norm",
    "add_layer_norm_ref",
    "bias_add",
    "bias_add_ref",
    "chosen_impl",
    "conv_in_norm",
    "conv_in_norm_ref",
    "decode_attention",
    "decode_attention_ref",
    "decode_mlp",
    "decode_mlp_ref",
    "decode_mlp_workspace",
    "greedy_logits_step",
    "greedy_logits_step_ref",
    "greedy_step",
    "greedy_step_ref",
    "group_norm",
    "group_norm_ref",
    "linear_gelu",
    "linear_gelu_ref",
    "masking",
    "masking_ref",
    "reset_dispatch",
    "vq_nearest",
    "vq_nearest_ref",
]
