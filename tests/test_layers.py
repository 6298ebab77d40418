"""Every import of a procap module respects the level table of docs/architecture.md.

Each module of ``procap/`` is parsed with ``ast``: module-level and function-local imports alike. A module may
import modules of its own level and of the levels below it, never one above. The table is read from the document,
so the drawing and the rule cannot drift apart; a module the table does not place fails the test too.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "procap"
ARCHITECTURE = ROOT / "docs" / "architecture.md"

# (importer, imported): the few upward imports that stay, each function-local, with the reason it stays.
EXCEPTIONS = {
    # ProCap.save_pretrained / from_pretrained / push_to_hub are the model's face of the pretrained-folder format:
    # each is one call into procap.hub, imported when called, so importing the model never imports the hub.
    ("procap.model.pretrained", "procap.hub"),
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


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(target: str) -> str:
    """``procap.x.y`` when ``procap/x/y.py`` or the package ``procap/x/y/`` exists, else the containing module."""
    parts = target.split(".")
    while len(parts) > 1:
        path = ROOT.joinpath(*parts)
        if path.with_suffix(".py").is_file() or (path / "__init__.py").is_file():
            return ".".join(parts)
        parts.pop()
    return "procap"


def imported_modules(module: str, source: str, is_package: bool = False) -> list[tuple[str, int]]:
    """``(procap module, line)`` for every import in ``source`` (any depth, relative imports resolved)."""
    package = module if is_package else module.rpartition(".")[0]
    found: list[tuple[str, int]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            targets = [f"{stem}.{alias.name}" for alias in node.names]
        else:
            continue
        for target in targets:
            if target == "procap" or target.startswith("procap."):
                found.append((_resolve(target), node.lineno))
    return list(dict.fromkeys(found))


def violations(module: str, source: str, table: dict[str, int], is_package: bool = False) -> list[str]:
    """One line per import of ``module`` that reaches a higher level (or a module the table does not place)."""
    own = level_of(module, table)
    if own is None:
        return [f"{module}: not placed in the layer table of docs/architecture.md"]
    out = []
    for target, line in imported_modules(module, source, is_package):
        level = level_of(target, table)
        if level is None:
            out.append(f"{module}:{line} imports {target}, which the layer table does not place")
        elif level > own and not any(
            module == a and (target == b or target.startswith(b + ".")) for a, b in EXCEPTIONS
        ):
            out.append(f"{module}:{line} (level {own}) imports {target} (level {level})")
    return out


@pytest.fixture(scope="module")
def table() -> dict[str, int]:
    table = level_table(ARCHITECTURE.read_text(encoding="utf-8"))
    assert table.get("procap") == 0 and table.get("procap.model") is not None, "layer table not found"
    return table


def test_every_import_respects_the_layers(table):
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = module_name(path)
        found += violations(module, path.read_text(encoding="utf-8"), table, path.name == "__init__.py")
    assert not found, "imports against docs/architecture.md's layers:\n" + "\n".join(found)


def test_exceptions_are_still_needed(table):
    """An exception that no import uses any more is removed from the list."""
    used = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        module = module_name(path)
        for target, _ in imported_modules(module, path.read_text(encoding="utf-8"), path.name == "__init__.py"):
            used |= {(a, b) for a, b in EXCEPTIONS if a == module and (target == b or target.startswith(b + "."))}
    assert used == EXCEPTIONS


def test_the_check_catches_upward_imports(table):
    """Fake modules importing upwards, at module level and inside a function, are reported; legal ones are not."""
    assert violations("procap.model.fake", "from procap.train import loop\n", table)
    local = "def f():\n    from procap.commands.caption import run\n    return run\n"
    assert violations("procap.data.fake", local, table)
    assert violations("procap.kernels.fake", "import procap.model.procap\n", table)
    assert violations("procap.model.fake", "from ..train.loop import Trainer\n", table)
    assert violations("procap.unplaced", "", table)
    assert not violations("procap.train.fake", "from procap.model.procap import ProCap\nfrom . import loop\n", table)
    assert not violations("procap.cli", "from procap import __version__\n", table)
