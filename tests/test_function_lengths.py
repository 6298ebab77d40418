"""Functions a reader can hold in mind: none of the package's is over 80 lines, and at most 30 are over 40.

A function's length is its ``def`` to its last line (decorators left out, docstring in), as ``ast`` gives them. What
stays over 40 is mostly Triton kernel bodies (one launch's work, whose helpers each add a compiled function) and
functions whose signature and docstring alone take most of it.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 80
LONG = 40
MAX_LONG_FUNCTIONS = 30


def function_lengths(roots: tuple[Path, ...] = (ROOT / "procap", ROOT / "kernels")) -> dict[str, int]:
    """``{"path:line name": lines}`` of every function and method under ``roots`` (a file reached twice, through
    the ``procap/kernels`` link and ``kernels/``, counted once)."""
    found: dict[str, int] = {}
    seen: set[Path] = set()
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            if path.resolve() in seen:
                continue
            seen.add(path.resolve())
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    name = f"{path.relative_to(root.parent)}:{node.lineno} {node.name}"
                    found[name] = node.end_lineno - node.lineno + 1
    return found


def test_no_function_is_over_80_lines():
    lengths = function_lengths()
    assert len(lengths) > 500, "no functions found"
    over = {name: lines for name, lines in lengths.items() if lines > MAX_LINES}
    assert not over, over


def test_at_most_30_functions_are_over_40_lines():
    long = sorted(((lines, name) for name, lines in function_lengths().items() if lines > LONG), reverse=True)
    assert len(long) <= MAX_LONG_FUNCTIONS, "\n".join(f"{lines} {name}" for lines, name in long)


def test_the_count_reads_a_planted_long_function(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(90))
    (tmp_path / "planted.py").write_text(f"def long():\n{body}\n\n\ndef short():\n    return 1\n")
    lengths = function_lengths((tmp_path,))
    assert lengths == {f"{tmp_path.name}/planted.py:1 long": 91, f"{tmp_path.name}/planted.py:94 short": 2}
