"""The one JSON / YAML reader (procap/json_files.py): a key given twice is refused wherever the package reads.

The last test keeps it the only one: no other module of the package parses JSON or YAML itself.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from procap.errors import ProCapError
from procap.json_files import DuplicateKeyError, parse_json, parse_yaml, read_json

PACKAGE = Path(__file__).resolve().parents[1] / "procap"


@pytest.mark.parametrize(
    "text,key",
    [
        ('{"a": 1, "a": 2}', "a"),
        ('{"outer": {"b": [1], "b": [2]}}', "b"),  # nested objects too
        ('[{"id": "x", "id": "y"}]', "id"),
    ],
)
def test_a_json_key_given_twice_is_one_sentence_naming_source_and_key(text, key):
    with pytest.raises(DuplicateKeyError, match=f"the source names the key '{key}' twice"):
        parse_json(text, "the source")


def test_a_json_file_names_itself(tmp_path):
    path = tmp_path / "c.json"
    path.write_text('{"steps": 1, "steps": 2}', encoding="utf-8")
    with pytest.raises(ProCapError, match=f"config {path} names the key 'steps' twice"):
        read_json(path, "config")
    path.write_text('{"steps": ', encoding="utf-8")
    with pytest.raises(ProCapError, match=f"config {path} is not valid JSON"):
        read_json(path, "config")


def test_a_yaml_key_given_twice_is_refused_and_merge_keys_still_work():
    pytest.importorskip("yaml", reason="YAML needs the [train] extra (pyyaml)")
    with pytest.raises(DuplicateKeyError, match="y.yaml names the key 'lr' twice"):
        parse_yaml("lr: 0.1\nsteps: 3\nlr: 0.2\n", "y.yaml")
    with pytest.raises(DuplicateKeyError, match="'b' twice"):
        parse_yaml("outer:\n  b: 1\n  b: 2\n", "y.yaml")
    # a key overriding one brought in by `<<` is YAML's meaning of a merge, not a repetition
    merged = parse_yaml("base: &base {lr: 0.1, steps: 3}\nrun:\n  <<: *base\n  lr: 0.2\n", "y.yaml")
    assert merged["run"] == {"lr": 0.2, "steps": 3}
    with pytest.raises(ProCapError, match="y.yaml is not readable YAML"):
        parse_yaml("a: [1, 2\n", "y.yaml")


def _parsing_calls(tree: ast.AST) -> list[tuple[int, str]]:
    """``(line, call)`` of every json.load / json.loads / yaml.load / yaml.safe_load / yaml.full_load call."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value
            name = f"{owner.id}.{node.func.attr}" if isinstance(owner, ast.Name) else ""
            if name in ("json.load", "json.loads", "yaml.load", "yaml.safe_load", "yaml.full_load"):
                found.append((node.lineno, name))
    return found


def test_no_module_but_json_files_parses_json_or_yaml():
    offenders = [
        f"{path.relative_to(PACKAGE.parent)}:{line} {call}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.name != "json_files.py"
        for line, call in _parsing_calls(ast.parse(path.read_text(encoding="utf-8")))
    ]
    assert offenders == [], "read through procap.json_files (read_json / parse_json / parse_yaml): " + ", ".join(
        offenders
    )
