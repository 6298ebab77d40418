"""Code a CUDA graph may capture makes no host-to-device copy: a static check, since a CPU run cannot show one.

Indexing with a Python list (``t[[0, -1]]``) builds the index tensor on the host and copies it to the device, which
CUDA graph capture refuses ("Cannot copy between CPU and CUDA tensors during CUDA graph capture"). On a CPU, or on
the meta device, no copy happens and no test of values can notice: one such index in the encoder pass made every
``Captioner`` with graphs fail on an H100 (docs/gpu.md, "second run"). The model and fast-path modules are read here
for list indices; the few that run outside any capture (weight surgery at load time) are named with their reason.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Modules whose code runs inside the captured encoder pass or decoding step (and the kernels they launch).
CAPTURED_PACKAGES = ("procap/model", "procap/fast", "procap/kernels/attention.py", "kernels")
# (file, function) pairs that index with a list outside any capture, each with why.
OUTSIDE_CAPTURE = {
    ("procap/model/procap.py", "without_procedure_queries"): "copies a state dict once, before any Captioner exists",
}


def _modules() -> list[Path]:
    found: list[Path] = []
    for name in CAPTURED_PACKAGES:
        path = ROOT / name
        found += [path] if path.suffix == ".py" else sorted(path.rglob("*.py"))
    return found


def list_indices(source: str) -> list[tuple[str, int, str]]:
    """``(enclosing function, line, expression)`` of every subscript whose index holds a list or list comprehension.

    Type annotations (``Callable[[...], ...]``) are subscripts too and are left out.
    """
    found = []

    def visit(node: ast.AST, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else function
            if isinstance(child, ast.Subscript) and not ast.unparse(child.value).endswith("Callable"):
                parts = child.slice.elts if isinstance(child.slice, ast.Tuple) else [child.slice]
                if any(isinstance(part, (ast.List, ast.ListComp)) for part in parts):
                    found.append((function, child.lineno, ast.unparse(child)))
            visit(child, inner)

    visit(ast.parse(source), "<module>")
    return found


def test_no_list_index_in_code_a_graph_captures():
    offending = []
    for path in _modules():
        relative = path.relative_to(ROOT).as_posix()
        for function, line, expression in list_indices(path.read_text()):
            if (relative, function) not in OUTSIDE_CAPTURE:
                offending.append(f"{relative}:{line} in {function}: {expression}")
    assert not offending, "index with a device tensor or a comparison instead:\n" + "\n".join(offending)


def test_the_check_finds_the_fault_it_was_written_for():
    # The code that failed on the H100, and the annotation that must not count.
    source = (
        "def with_difference(tokens, frames):\n"
        "    ends = torch.zeros(frames)\n"
        "    ends[[0, -1]] = 1.0\n"
        "    picked = tokens[:, [i for i in range(2)]]\n"
        "    hook: Callable[[torch.Tensor], None] = None\n"
    )
    found = list_indices(source)
    assert [(f, line) for f, line, _ in found] == [("with_difference", 3), ("with_difference", 4)]
    for (relative, function), reason in OUTSIDE_CAPTURE.items():  # each exception still exists and says why
        assert reason and function in {f for f, _, _ in list_indices((ROOT / relative).read_text())}
