"""Every import of a procap module respects the level table of docs/architecture.md, and no imports go round a loop.

Each module of the ``procap`` package is parsed with ``ast``: module-level and function-local imports alike. The
scan follows links, so ``procap/kernels`` (a link to ``kernels/``) is read as ``procap.kernels.*``, the names Python
imports it by. A module may import modules of its own level and of the levels below it, never one above. The table
is read from the document, so the drawing and the rule cannot drift apart; a module the table does not place fails
the test too. Imports that run (everything but ``if TYPE_CHECKING:`` blocks) must form no cycle, at any level.
"""

from __future__ import annotations

import ast
import functools
import itertools
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "procap"
ARCHITECTURE = ROOT / "docs" / "architecture.md"

# (importer, imported): upward imports that stay, each function-local, with the reason it stays. None today: the
# model's pretrained-folder methods read and write files below it (docs/architecture.md, "Layers"). An exception
# would permit the upward edge only; it may never close a loop (test_no_import_goes_round_a_loop).
EXCEPTIONS: set[tuple[str, str]] = set()

# The package root holds only these modules (the package itself, the one version, ``python -m procap``) and the
# public names; every other module sits in a folder that is one row of the table.
ROOT_MODULES = {"procap", "procap._version", "procap.__main__"}
# Public names kept at the root, each the module it hands over: ``procap.config`` is ``procap.core.config``.
PUBLIC_NAMES = {
    "procap.config": "procap.core.config",
    "procap.errors": "procap.core.errors",
    "procap.attention": "procap.kernels.attention",
    "procap.checkpoint": "procap.loading.checkpoint",
    "procap.hub": "procap.loading.hub",
}


def level_table(text: str) -> dict[str, int]:
    """``{module or package: level}`` from the rows ``| <level> | <name> | `procap.x`, ... |`` of the layer table."""
    table: dict[str, int] = {}
    for line in text.splitlines():
        match = re.match(r"\|\s*(\d+)\s*\|[^|]*\|(.*)\|\s*$", line)
        if match:
            for name in re.findall(r"`(procap[\w.]*)`", match.group(2)):
                table[name] = int(match.group(1))
    return table


def level_of(module: str, table: dict[str, int]) -> int | None:
    """The level of ``module``: its own row or the row of its closest package (``procap`` itself matches only
    ``procap``, so a new top-level module must be placed in the table)."""
    parts = module.split(".")
    for end in range(len(parts), 1, -1):
        name = ".".join(parts[:end])
        if name in table:
            return table[name]
    return table.get(module) if module == "procap" else None


def module_name(path: Path, root: Path = ROOT) -> str:
    """``procap.x.y`` of ``root/procap/x/y.py`` (the path as reached, links not resolved)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package_files(root: Path = ROOT) -> dict[str, Path]:
    """``{module name: file}`` for every module of the package ``root/procap``, linked folders included.

    ``Path.rglob`` does not enter a linked folder, and ``procap/kernels`` is one; ``os.walk`` is told to follow links
    and keeps the linked path, so a kernel module is named as it is imported. A link back up is entered only once.
    """
    found: dict[str, Path] = {}
    visited: set[Path] = set()
    for folder, subfolders, files in os.walk(root / "procap", followlinks=True):
        real = Path(folder).resolve()
        if real in visited:
            subfolders.clear()
            continue
        visited.add(real)
        subfolders[:] = sorted(name for name in subfolders if name != "__pycache__")
        for name in sorted(files):
            if name.endswith(".py"):
                path = Path(folder) / name
                found[module_name(path, root)] = path
    return found


@functools.cache
def _package_modules() -> frozenset[str]:
    return frozenset(package_files())


def _resolve(target: str, known: Iterable[str]) -> str:
    """``target`` when it is a module of ``known``, else its closest containing module (a name imported from it)."""
    parts = target.split(".")
    while len(parts) > 1:
        if ".".join(parts) in known:
            return ".".join(parts)
        parts.pop()
    return "procap"


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(tree: ast.AST, runtime_only: bool) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement of ``tree``, at any depth; with ``runtime_only`` not those under ``if TYPE_CHECKING:``
    (they never run, so they cannot close a loop; their ``else`` branch does run)."""
    pending: list[ast.AST] = [tree]
    while pending:
        node = pending.pop()
        if runtime_only and isinstance(node, ast.If) and _is_type_checking(node.test):
            pending.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        pending.extend(ast.iter_child_nodes(node))


def imported_modules(
    module: str,
    source: str,
    is_package: bool = False,
    known: Iterable[str] | None = None,
    runtime_only: bool = False,
) -> list[tuple[str, int]]:
    """``(procap module, line)`` for every import in ``source`` (any depth, relative imports resolved), in line order.

    ``known`` is the set of module names imports resolve against (default: the package's own modules).
    """
    known = _package_modules() if known is None else known
    package = module if is_package else module.rpartition(".")[0]
    found: list[tuple[str, int]] = []
    for node in sorted(_import_nodes(ast.parse(source), runtime_only), key=lambda node: node.lineno):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            targets = [f"{stem}.{alias.name}" for alias in node.names]
        for target in targets:
            if target == "procap" or target.startswith("procap."):
                found.append((_resolve(target, known), node.lineno))
    return list(dict.fromkeys(found))


def _is_exception(module: str, target: str) -> bool:
    return any(module == a and (target == b or target.startswith(b + ".")) for a, b in EXCEPTIONS)


def violations(
    module: str, source: str, table: dict[str, int], is_package: bool = False, known: Iterable[str] | None = None
) -> list[str]:
    """One line per import of ``module`` that reaches a higher level (or a module the table does not place)."""
    own = level_of(module, table)
    if own is None:
        return [f"{module}: not placed in the layer table of docs/architecture.md"]
    out = []
    for target, line in imported_modules(module, source, is_package, known):
        level = level_of(target, table)
        if level is None:
            out.append(f"{module}:{line} imports {target}, which the layer table does not place")
        elif level > own and not _is_exception(module, target):
            out.append(f"{module}:{line} (level {own}) imports {target} (level {level})")
    return out


def layer_violations(files: Mapping[str, Path], table: dict[str, int]) -> list[str]:
    """:func:`violations` of every module of ``files`` (a :func:`package_files` result)."""
    found = []
    for module, path in sorted(files.items()):
        source = path.read_text(encoding="utf-8")
        found += violations(module, source, table, path.name == "__init__.py", files)
    return found


def import_graph(sources: Mapping[str, str], packages: Iterable[str] = ()) -> dict[str, dict[str, int]]:
    """``{module: {imported module: line}}`` of the imports that run, between the modules of ``sources``
    (``{module: source}``; ``packages`` names those that are ``__init__`` files). A name a module imports from
    itself is no edge."""
    packages = set(packages)
    graph: dict[str, dict[str, int]] = {}
    for module, source in sources.items():
        edges: dict[str, int] = {}
        for target, line in imported_modules(module, source, module in packages, sources, runtime_only=True):
            if target != module and target in sources:
                edges.setdefault(target, line)
        graph[module] = edges
    return graph


def import_cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """One loop ``[a, b, ..., a]`` per strongly connected group of modules (Tarjan), the shortest one through the
    group's first module by name; a module importing itself is a loop of one. Groups in name order."""
    order: dict[str, int] = {}
    lowest: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(module: str) -> None:
        order[module] = lowest[module] = len(order)
        stack.append(module)
        on_stack.add(module)
        for target in graph.get(module, ()):
            if target not in order:
                visit(target)
                lowest[module] = min(lowest[module], lowest[target])
            elif target in on_stack:
                lowest[module] = min(lowest[module], order[target])
        if lowest[module] == order[module]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == module:
                    break
            if len(group) > 1 or module in graph.get(module, ()):
                groups.append(sorted(group))

    for module in sorted(graph):
        if module not in order:
            visit(module)
    return [_shortest_loop(group[0], set(group), graph) for group in sorted(groups)]


def _shortest_loop(start: str, group: set[str], graph: Mapping[str, Iterable[str]]) -> list[str]:
    """Breadth-first from ``start`` inside ``group`` (strongly connected, so a way back exists) until it returns."""
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for module in frontier:
            for target in sorted(graph.get(module, ())):
                if target == start:
                    loop = [start, module]
                    while loop[-1] != start:
                        loop.append(came_from[loop[-1]])
                    return loop[::-1]
                if target in group and target not in came_from:
                    came_from[target] = module
                    following.append(target)
        frontier = following
    raise AssertionError(f"{sorted(group)} is not strongly connected")


def describe_loop(loop: list[str], graph: Mapping[str, Mapping[str, int]]) -> str:
    """``a:12 -> b:3 -> a``: each module with the line of its import of the next one."""
    return " -> ".join(
        [f"{module}:{graph[module][target]}" for module, target in itertools.pairwise(loop)] + [loop[-1]]
    )


@pytest.fixture(scope="module")
def table() -> dict[str, int]:
    table = level_table(ARCHITECTURE.read_text(encoding="utf-8"))
    assert table.get("procap") == 0 and table.get("procap.model") is not None, "layer table not found"
    return table


def test_the_scan_reads_the_kernels_through_the_package_link():
    assert (PACKAGE / "kernels").is_symlink()
    files = package_files()
    kernels = {path.name for module, path in files.items() if module.startswith("procap.kernels.")}
    assert kernels == {path.name for path in (ROOT / "kernels").glob("*.py") if path.name != "__init__.py"}
    assert files["procap.kernels"].name == "__init__.py" and "procap.model.procap" in files


def test_every_import_respects_the_layers(table):
    found = layer_violations(package_files(), table)
    assert not found, "imports against docs/architecture.md's layers:\n" + "\n".join(found)


def test_exceptions_are_still_needed():
    """An exception that no import uses any more is removed from the list."""
    used = set()
    for module, path in package_files().items():
        for target, _ in imported_modules(module, path.read_text(encoding="utf-8"), path.name == "__init__.py"):
            used |= {(a, b) for a, b in EXCEPTIONS if a == module and (target == b or target.startswith(b + "."))}
    assert used == EXCEPTIONS


def test_no_import_goes_round_a_loop():
    files = package_files()
    sources = {module: path.read_text(encoding="utf-8") for module, path in files.items()}
    graph = import_graph(sources, [module for module, path in files.items() if path.name == "__init__.py"])
    assert len(graph) == len(files) and graph["procap.model.procap"], "the import graph is empty"
    loops = [describe_loop(loop, graph) for loop in import_cycles(graph)]
    assert not loops, "imports that go round a loop (module:line of each import):\n" + "\n".join(loops)


def test_the_check_catches_upward_imports(table):
    """Fake modules importing upwards, at module level and inside a function, are reported; legal ones are not."""
    assert violations("procap.model.fake", "from procap.train import loop\n", table)
    local = "def f():\n    from procap.commands.caption import run\n    return run\n"
    assert violations("procap.data.fake", local, table)
    assert violations("procap.kernels.fake", "import procap.model.procap\n", table)
    assert violations("procap.model.fake", "from ..train.loop import Trainer\n", table)
    typing_only = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from procap.fast import Captioner\n"
    assert violations("procap.model.fake", typing_only, table)  # an annotation reaching up is still reaching up
    assert violations("procap.unplaced", "", table)
    assert not violations("procap.train.fake", "from procap.model.procap import ProCap\nfrom . import loop\n", table)
    assert not violations("procap.commands.cli", "from procap import __version__\n", table)


def test_the_check_catches_an_upward_import_planted_in_a_linked_kernel(tmp_path, table):
    """The same scan as the real test, over a copy of the layout: ``procap/kernels`` links to ``../kernels``, whose
    ``vq.py`` imports the model."""
    (tmp_path / "procap" / "model").mkdir(parents=True)
    (tmp_path / "procap" / "__init__.py").write_text("")
    (tmp_path / "procap" / "model" / "__init__.py").write_text("")
    (tmp_path / "procap" / "model" / "procap.py").write_text("from procap.kernels.vq import vq_nearest\n")
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "__init__.py").write_text("from procap.kernels.vq import vq_nearest\n")
    (tmp_path / "kernels" / "vq.py").write_text(
        "import torch\n\n\ndef f():\n    from procap.model.procap import ProCap\n"
    )
    (tmp_path / "procap" / "kernels").symlink_to(Path("..") / "kernels", target_is_directory=True)
    files = package_files(tmp_path)
    assert set(files) == {"procap", "procap.model", "procap.model.procap", "procap.kernels", "procap.kernels.vq"}
    assert layer_violations(files, table) == ["procap.kernels.vq:5 (level 1) imports procap.model.procap (level 3)"]
    graph = import_graph({module: path.read_text() for module, path in files.items()}, ["procap.kernels"])
    loops = [describe_loop(loop, graph) for loop in import_cycles(graph)]
    assert loops == ["procap.kernels.vq:5 -> procap.model.procap:1 -> procap.kernels.vq"]


def test_a_modules_folder_is_its_level(table):
    """Each row of the table is a folder of the package (bar the root modules and the public names), and the root
    holds nothing else: a file's level is read from its path."""
    files = package_files()
    for name in table:
        if name in ROOT_MODULES or name in PUBLIC_NAMES:
            continue
        assert name.count(".") == 1 and files[name].name == "__init__.py", f"table row {name} is not a top folder"
    at_root = {module for module, path in files.items() if path.parent == PACKAGE and path.name != "__init__.py"}
    assert at_root | {"procap"} == ROOT_MODULES | set(PUBLIC_NAMES)


def test_the_public_names_are_the_modules_they_name(table):
    import importlib

    for public, real in PUBLIC_NAMES.items():
        assert importlib.import_module(public) is importlib.import_module(real)
        assert level_of(public, table) == level_of(real, table), public


def test_the_library_imports_real_paths_not_public_names():
    """Inside the package a public name is never imported: its level would be read from the wrong row."""
    found = []
    for module, path in package_files().items():
        if module in PUBLIC_NAMES:
            continue
        for target, line in imported_modules(module, path.read_text(encoding="utf-8"), path.name == "__init__.py"):
            if target in PUBLIC_NAMES:
                found.append(f"{module}:{line} imports {target} (import {PUBLIC_NAMES[target]})")
    assert not found, "\n".join(found)


def test_the_loop_finder_on_a_small_graph():
    graph = {"a": ["b"], "b": ["c", "d"], "c": ["a", "d"], "d": [], "e": ["e"], "f": ["g", "d"], "g": ["f"]}
    assert import_cycles(graph) == [["a", "b", "c", "a"], ["e", "e"], ["f", "g", "f"]]
    # Two loops through one module are one group; the shortest loop through its first module is reported.
    assert import_cycles({"a": ["b", "c"], "b": ["c"], "c": ["a"]}) == [["a", "c", "a"]]
    assert import_cycles({"a": ["b", "c"], "b": ["c"], "c": [], "d": ["a"]}) == []


def test_the_loop_check_sees_function_local_imports_and_not_type_checking_blocks():
    sources = {
        "procap.model.a": "from procap.model import b\n",
        "procap.model.b": "import torch\n\n\ndef f():\n    from procap.model.a import helper\n",
    }
    graph = import_graph(sources)
    assert graph == {"procap.model.a": {"procap.model.b": 1}, "procap.model.b": {"procap.model.a": 5}}
    assert describe_loop(import_cycles(graph)[0], graph) == "procap.model.a:1 -> procap.model.b:5 -> procap.model.a"
    typing_only = "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from procap.model.a import helper\n"
    assert import_cycles(import_graph({**sources, "procap.model.b": typing_only})) == []
    runs_anyway = typing_only + "else:\n    from procap.model.a import helper\n"
    assert import_cycles(import_graph({**sources, "procap.model.b": runs_anyway})) == [
        ["procap.model.a", "procap.model.b", "procap.model.a"]
    ]


# -- the module table of docs/architecture.md ("## Modules"): one row per module, under its level -------------------

MODULES_SECTION = "## Modules"
LEVEL_HEADING = re.compile(r"### Level (\d+)\b")


def module_rows(text: str) -> list[tuple[str, int | None]]:
    """``(first cell, level)`` of every table row of the "Modules" section: the level of the ``### Level N`` heading
    above the row, None under any other heading (the files beside the package)."""
    rows: list[tuple[str, int | None]] = []
    inside, level = False, None
    for line in text.splitlines():
        if line.startswith("## "):
            inside, level = line.strip() == MODULES_SECTION, None
        elif inside and line.startswith("### "):
            heading = LEVEL_HEADING.match(line)
            level = int(heading.group(1)) if heading else None
        elif inside and line.startswith("|") and not re.match(r"\|\s*(---|module|path)\s*\|", line):
            rows.append((line.split("|")[1].strip(), level))
    return rows


def hands_names_on_only(source: str) -> bool:
    """True for a module holding only its docstring, imports, ``__all__`` and ``if TYPE_CHECKING:`` imports: an
    ``__init__.py`` the table leaves to the modules it imports from."""
    for node in ast.parse(source).body:
        docstring = isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        names_all = bool(targets) and all(isinstance(t, ast.Name) and t.id == "__all__" for t in targets)
        typing_only = isinstance(node, ast.If) and _is_type_checking(node.test) and not node.orelse
        if not (docstring or names_all or typing_only or isinstance(node, (ast.Import, ast.ImportFrom))):
            return False
    return True


def documented_modules(files: Mapping[str, Path], root: Path = ROOT) -> dict[str, str]:
    """``{path as the table writes it: module}`` for every module the table must name: all but the ``__init__.py``
    files that only hand names on."""
    return {
        path.relative_to(root).as_posix(): module
        for module, path in files.items()
        if path.name != "__init__.py" or not hands_names_on_only(path.read_text(encoding="utf-8"))
    }


def module_table_problems(text: str, files: Mapping[str, Path], table: dict[str, int], root: Path = ROOT) -> list[str]:
    """One line per way the module table of ``text`` and the package ``files`` disagree."""
    rows = module_rows(text)
    wanted = documented_modules(files, root)
    problems = []
    counts: dict[str, int] = {}
    for cell, _ in rows:
        counts[cell] = counts.get(cell, 0) + 1
    for cell, level in rows:
        path = re.fullmatch(r"`([^`\s]+)`", cell)
        if not path:
            problems.append(f"row {cell!r}: the first column is one path in backquotes")
            continue
        path = path.group(1)
        if counts[cell] > 1:
            problems.append(f"{path}: {counts[cell]} rows")
            counts[cell] = 1  # said once
        if not (root / path).exists():
            problems.append(f"{path}: no such file")
        elif path.startswith("procap/") and path not in wanted:
            kind = "an __init__.py that only hands names on" if path.endswith("__init__.py") else "no module"
            problems.append(f"{path}: {kind}, so no row")
        elif path in wanted and level != level_of(wanted[path], table):
            problems.append(f"{path}: under level {level}, but its folder is level {level_of(wanted[path], table)}")
        elif not path.startswith("procap/") and level is not None:
            problems.append(f"{path}: outside the package, so not under a level")
    listed = {cell.strip("`") for cell, _ in rows}
    problems += [f"{path}: no row" for path in sorted(set(wanted) - listed)]
    return problems


def test_the_module_table_names_every_module_once_under_its_level(table):
    problems = module_table_problems(ARCHITECTURE.read_text(encoding="utf-8"), package_files(), table)
    assert not problems, "docs/architecture.md's module table:\n" + "\n".join(problems)


def test_the_module_table_check_catches_a_missing_a_doubled_and_a_bogus_row(table):
    """Each change planted into a copy of the document's text is reported, and only it."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    files = package_files()
    beam = next(line for line in text.splitlines() if line.startswith("| `procap/model/beam.py` |"))
    vocab = next(line for line in text.splitlines() if line.startswith("| `procap/data/vocab.py` |"))

    def planted(old: str, new: str) -> list[str]:
        assert text.count(old) == 1
        return module_table_problems(text.replace(old, new), files, table)

    assert planted(beam, beam + "\n| `procap/fast/lean_decode.py` | gone |") == [
        "procap/fast/lean_decode.py: no such file"
    ]
    assert planted(beam, beam + "\n" + beam) == ["procap/model/beam.py: 2 rows"]
    assert planted(beam + "\n", "") == ["procap/model/beam.py: no row"]
    assert planted(vocab, vocab + "\n" + beam) == [
        "procap/model/beam.py: 2 rows",
        "procap/model/beam.py: under level 2, but its folder is level 3",
    ]
    assert planted(beam, beam + "\n| `procap/kernels/__init__.py` | names |") == [
        "procap/kernels/__init__.py: an __init__.py that only hands names on, so no row"
    ]
    assert planted(beam, beam + "\n| `procap/model` | the folder |") == ["procap/model: no module, so no row"]
    assert planted(beam, beam + "\n| `hubconf.py` | again |") == [
        "hubconf.py: 2 rows",
        "hubconf.py: outside the package, so not under a level",
    ]


def test_an_init_that_defines_something_needs_a_row():
    assert hands_names_on_only('"""Doc."""\nfrom procap.x import y\n\n__all__ = ["y"]\n')
    assert hands_names_on_only("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from procap.x import y\n")
    assert hands_names_on_only("")
    assert not hands_names_on_only("from procap.x import y\n\nZ = 1\n")
    assert not hands_names_on_only("def __getattr__(name):\n    raise AttributeError(name)\n")
    assert not hands_names_on_only("if TYPE_CHECKING:\n    pass\nelse:\n    import torch\n")
