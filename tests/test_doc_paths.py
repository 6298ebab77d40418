"""Every repository path the docs quote exists, and where a quote names something in a Python file
(``procap/fast/inputs.py:to_image_batch``, ``tests/kernels/test_groupnorm.py::test_in_bias_*``), the file defines it.

Read: README.md and docs/*.md, prose and code blocks alike. A path is a word starting with one of the repository's
top folders; one written inside another path (``runs/demo/procap/best.safetensors``), a template (``<op>``) or a
glob is not checked. CHANGELOG.md is history, naming files as they were then, and is left out.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TOP_FOLDERS = ("bench", "docs", "kernels", "procap", "tests", "tools")

# a top folder, then path characters; not inside another path or word; a trailing ``:name``, ``::name`` or
# ``:Class.name`` (``*`` after it: a prefix) names something the file defines
QUOTED_PATH = re.compile(
    r"(?<![\w./~-])(?P<path>(?:"
    + "|".join(TOP_FOLDERS)
    + r")/[\w./-]*)(?P<more>[<*${]?)(?::{1,2}(?P<name>\w+(?:\.\w+)?)(?P<prefix>\*)?)?"
)


def quoted_paths(text: str) -> list[tuple[int, str, str | None, bool]]:
    """``(line, path, name or None, name is a prefix)`` of every repository path quoted in ``text``."""
    found = []
    for match in QUOTED_PATH.finditer(text):
        if match.group("more"):  # a template or a glob: no one file
            continue
        path = match.group("path").rstrip(".")
        found.append((text.count("\n", 0, match.start()) + 1, path, match.group("name"), bool(match.group("prefix"))))
    return found


@functools.cache
def defined_names(path: Path) -> frozenset[str]:
    """What a Python file defines: its classes, functions and assigned or imported names at any depth, and each
    class's own as ``Class.name``."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.alias):
            names.add((node.asname or node.name).split(".")[0])
        if isinstance(node, ast.ClassDef):
            for member in ast.walk(node):
                if isinstance(member, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and member is not node:
                    names.add(f"{node.name}.{member.name}")
                elif isinstance(member, ast.Name) and isinstance(member.ctx, ast.Store):
                    names.add(f"{node.name}.{member.id}")
    return frozenset(names)


def path_problems(text: str, source: str, root: Path = ROOT) -> list[str]:
    """One line per quoted path of ``text`` that does not exist, or names what its file does not define."""
    problems = []
    for line, path, name, prefix in quoted_paths(text):
        where = f"{source}:{line}: {path}"
        if not (root / path).exists():
            problems.append(f"{where}: no such file or folder")
        elif name and path.endswith(".py"):
            names = defined_names(root / path)
            if not (any(n.startswith(name) for n in names) if prefix else name in names):
                problems.append(f"{where}: defines no {name}{'*' if prefix else ''}")
    return problems


def test_every_top_folder_exists():
    assert all((ROOT / folder).is_dir() for folder in TOP_FOLDERS)
    assert len(DOCS) > 5


@pytest.mark.parametrize("doc", DOCS, ids=lambda doc: doc.name)
def test_every_path_a_doc_quotes_exists(doc):
    problems = path_problems(doc.read_text(encoding="utf-8"), doc.relative_to(ROOT).as_posix())
    assert not problems, "\n".join(problems)


def test_the_check_catches_a_moved_file_and_a_renamed_name():
    text = (
        "See `procap/fast/lean_decode.py` and `procap/model/sequence.py:SequenceAssembly.embed_frames`,\n"
        "`procap/model/procap.py:ProCap.embed_frames`, `tests/kernels/test_groupnorm.py::test_in_bias_*`,\n"
        "`tests/kernels/test_groupnorm.py::test_no_such_*` and kernels/vq.py:vq_nearest.\n"
        "Not checked: runs/demo/procap/best.safetensors, `kernels/<op>.py`, `kernels/csrc/cuda/*.cu`, procap.fast, "
        "bench/results/cpu-$(date +%F).json.\n"
    )
    assert path_problems(text, "planted") == [
        "planted:1: procap/fast/lean_decode.py: no such file or folder",
        "planted:2: procap/model/procap.py: defines no ProCap.embed_frames",
        "planted:3: tests/kernels/test_groupnorm.py: defines no test_no_such_*",
    ]
