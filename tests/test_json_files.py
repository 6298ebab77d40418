"""The one JSON / YAML reader (procap/core/json_files.py): a key given twice is refused wherever the package reads.

The last test keeps it the only one: no other module of the package parses JSON or YAML itself.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from procap.core.errors import ProCapError
from procap.core.json_files import DuplicateKeyError, json_lines, parse_json, parse_yaml, read_json, read_json_lines

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
    assert offenders == [], "read through procap.core.json_files (read_json / parse_json / parse_yaml): " + ", ".join(
        offenders
    )


# -- sizes bounded before memory is taken (issue 39 B) --------------------------------------------------------------
def _pair_list(path: Path) -> None:
    from procap.data.pair_lists import read_pair_list

    read_pair_list(path)


def _config_file(path: Path) -> None:
    from procap.commands.cli_args import read_config_file

    read_config_file(path, "train")


@pytest.mark.parametrize(
    ("name", "text", "read"),
    [
        ("data.json", '{"p1": ["' + "a" * 5000 + '"]}', lambda path: read_json(path, "reference file")),
        ("config.json", '{"steps": 1, "note": "' + "a" * 5000 + '"}', _config_file),
        ("config.yaml", "steps: 1\nnote: " + "a" * 5000 + "\n", _config_file),
        ("pairs.jsonl", '{"before": "a.png", "after": "b.png"}\n' * 200, _pair_list),
        ("pairs.csv", "before,after\n" + "a.png,b.png\n" * 500, _pair_list),
    ],
    ids=["json", "config", "yaml config", "json lines", "csv"],
)
def test_a_text_file_over_the_ceiling_is_refused_from_its_size(tmp_path, monkeypatch, name, text, read):
    import procap.core.json_files

    monkeypatch.setattr(procap.core.json_files, "MAX_TEXT_BYTES", 4096)
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    assert path.stat().st_size > 4096
    opened = []
    real_open = open
    monkeypatch.setattr("builtins.open", lambda file, *a, **k: opened.append(file) or real_open(file, *a, **k))
    with pytest.raises(ProCapError, match=r"holds \d[\d,]* bytes, more than the 4,096") as caught:
        read(path)
    assert str(path) in str(caught.value) and "\n" not in str(caught.value)
    assert str(path) not in map(str, opened)  # refused from its size: not a byte was read


def test_the_bounded_read_still_reads_files_under_the_ceiling(tmp_path):
    from procap.core.json_files import MAX_TEXT_BYTES, read_bytes

    path = tmp_path / "ok.json"
    path.write_text('{"a": [1, 2]}', encoding="utf-8")
    assert read_bytes(path, "file") == b'{"a": [1, 2]}' and read_json(path) == {"a": [1, 2]}
    assert MAX_TEXT_BYTES == 2**30


def test_json_nested_beyond_the_parser_is_one_sentence(tmp_path):
    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000 + "]" * 100_000, encoding="utf-8")
    with pytest.raises(ProCapError, match="nested too deeply"):
        read_json(path, "reference file")


def test_json_lines_numbers_lines_and_skips_cut_ones_only_when_asked(tmp_path):
    text = '{"step": 1}\n\n{"step": 2}\n{"step": 3, "lo'  # the last line cut mid-write
    with pytest.raises(ProCapError, match="log line 4 is not valid JSON"):
        json_lines(text, "log")
    assert json_lines(text, "log", skip_unparsed=True) == [(1, {"step": 1}), (3, {"step": 2})]


def test_one_reader_of_training_logs(tmp_path):
    """JsonlLog.records (a resumed run), the demo's report and its progress line read log.jsonl with
    read_json_lines: the run strictly, the demo's readers past a line being written."""
    from procap.experiments.demo import _last_step
    from procap.experiments.report import read_log
    from procap.train.loop import JsonlLog

    path = tmp_path / "log.jsonl"
    assert read_json_lines(path, "log") == [] and JsonlLog(path).records() == [] and _last_step(path) is None
    log = JsonlLog(path)
    for record in ({"step": 1, "items_per_s": 5.0}, {"step": 1, "CIDEr": 0.5}):
        log.write(record)
    assert log.records() == read_json_lines(path, "log") == read_log(path)
    with path.open("a") as handle:
        handle.write('{"step": 2, "items_')
    assert (
        read_log(path)
        == read_json_lines(path, "log", partial=True)
        == [
            {"step": 1, "items_per_s": 5.0},
            {"step": 1, "CIDEr": 0.5},
        ]
    )
    assert _last_step(path) == {"step": 1, "items_per_s": 5.0}
    with pytest.raises(ProCapError, match=f"log {path} line 3 is not valid JSON"):
        log.records()
