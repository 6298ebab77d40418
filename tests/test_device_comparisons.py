"""Devices are compared one way: through ``procap.core.validate.same_device``, never with ``==`` / ``!=``.

``torch.device("cuda") != torch.device("cuda:0")`` although a tensor made on ``cuda`` lives on ``cuda:0``; an
equality test of devices is right on the CPU and wrong on every GPU, so CI (CPU only) cannot catch it by running
the code. This test reads the source instead: a comparison whose operand is a ``.device`` attribute, a
``torch.device(...)`` call or a name ending in ``device`` fails, unless the other operand is a string constant
(a device *name* from a config, such as ``"auto"``). Comparing ``.type`` or ``.index`` stays allowed.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("procap", "kernels", "bench")


def _is_device_expression(node: ast.expr) -> bool:
    if isinstance(node, ast.Attribute):
        return node.attr == "device" or node.attr.endswith("_device")
    if isinstance(node, ast.Name):
        return node.id == "device" or node.id.endswith("_device")
    if isinstance(node, ast.Call):
        func = node.func
        return isinstance(func, ast.Attribute) and func.attr == "device" and getattr(func.value, "id", "") == "torch"
    return False


def _is_string(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def device_comparisons(source: str) -> list[int]:
    """Line numbers of ``==`` / ``!=`` comparisons between devices in ``source``."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        for op, left, right in zip(node.ops, operands, operands[1:]):
            if not isinstance(op, (ast.Eq, ast.NotEq)) or _is_string(left) or _is_string(right):
                continue
            if _is_device_expression(left) or _is_device_expression(right):
                lines.append(node.lineno)
    return lines


def _sources() -> list[Path]:
    files = []
    for folder in SCANNED:
        files += sorted((ROOT / folder).rglob("*.py"))  # kernels/ read directly: procap/kernels is a link to it
    return [f for f in files if "procap/kernels" not in f.as_posix()]


def test_no_device_is_compared_with_equality():
    found = [f"{path.relative_to(ROOT)}:{line}" for path in _sources() for line in device_comparisons(path.read_text())]
    assert not found, f"compare devices with procap.core.validate.same_device, not ==/!=: {found}"


@pytest.mark.parametrize(
    ("source", "flagged"),
    [
        ("ok = torch.device(d) != weight.device", True),
        ("ok = x.device == y.device", True),
        ("ok = device != other_device", True),
        ("ok = same_device(device, weight.device)", False),
        ("ok = x.device.type == 'cuda'", False),
        ("ok = device == 'auto'", False),
        ("ok = device.index == 0", False),
    ],
)
def test_the_scan_finds_device_equality(source, flagged):
    assert bool(device_comparisons(source)) is flagged
