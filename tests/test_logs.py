"""Logging: library modules never print, the command line's console handler keeps each line on the stream it was
printed to, and ``procap --quiet`` / ``--verbose`` turn the ``procap`` logger down or up."""

from __future__ import annotations

import argparse
import ast
import logging
from pathlib import Path

import pytest

from procap.commands.cli import build_parser, log_level, main
from procap.core.logs import LOGGER_NAME, TO_STDOUT, console_logging

ROOT = Path(__file__).resolve().parents[1]
# The command line and its commands print their results (captions, tables, `procap info`); nothing else may.
COMMAND_LAYER = (ROOT / "procap" / "commands",)
# A module run with `python -m` (tools such as kernels/compile_check.py) prints its report from its main function.
PROGRAM_ENTRY_POINTS = {"main", "_main"}


def prints_outside_entry_points(path: Path) -> list[int]:
    """Lines of ``path`` that call ``print`` anywhere but inside a function named as a program's entry point."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    allowed: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name in PROGRAM_ENTRY_POINTS:
            allowed.update(id(inner) for inner in ast.walk(node))
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "print"
        and id(node) not in allowed
    ]


def library_files() -> list[Path]:
    files = sorted((ROOT / "procap").rglob("*.py")) + sorted((ROOT / "kernels").rglob("*.py"))
    return [
        path
        for path in files
        if not any(path == layer or layer in path.parents for layer in COMMAND_LAYER) and path.is_file()
    ]


def test_library_modules_log_instead_of_printing():
    files = library_files()
    assert ROOT / "procap" / "train" / "loop.py" in files and len(files) > 50  # the scan sees the library
    found = {str(path.relative_to(ROOT)): lines for path in files if (lines := prints_outside_entry_points(path))}
    assert found == {}, f"print() in library modules (log through logging.getLogger(__name__)): {found}"


def test_the_print_scan_finds_a_print_outside_an_entry_point(tmp_path):
    module = tmp_path / "module.py"
    module.write_text("def main():\n    print('report')\n\n\ndef helper():\n    print('chatter')\n")
    assert prints_outside_entry_points(module) == [6]


@pytest.fixture
def procap_logger():
    """The ``procap`` logger, with its level, handlers and propagation put back after the test."""
    logger = logging.getLogger(LOGGER_NAME)
    saved = logger.level, list(logger.handlers), logger.propagate
    yield logger
    logger.setLevel(saved[0])
    logger.handlers[:] = saved[1]
    logger.propagate = saved[2]


def test_the_console_handler_writes_results_to_stdout_and_the_rest_to_stderr(procap_logger, capsys):
    logger = logging.getLogger(f"{LOGGER_NAME}.some.module")
    with console_logging(logging.DEBUG):
        logger.info("stage2 step 4 validation: CIDEr 1.00", extra=TO_STDOUT)
        logger.info("note %d", 1)
        logger.warning("procap: note: %s.", "a save was finished")
        logger.debug("detail")
    out, err = capsys.readouterr()
    assert out == "stage2 step 4 validation: CIDEr 1.00\n"
    assert err == "note 1\nprocap: note: a save was finished.\ndetail\n"


def test_console_logging_puts_the_logger_back(procap_logger, capsys):
    procap_logger.setLevel(logging.ERROR)
    handlers = list(procap_logger.handlers)
    with console_logging(logging.INFO):
        assert procap_logger.level == logging.INFO and not procap_logger.propagate
    assert (procap_logger.level, procap_logger.handlers, procap_logger.propagate) == (logging.ERROR, handlers, True)
    logging.getLogger(f"{LOGGER_NAME}.x").error("after the block: not the console handler's")
    assert "after the block" not in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "level"),
    [([], logging.INFO), (["--quiet"], logging.WARNING), (["-q"], logging.WARNING), (["--verbose"], logging.DEBUG)],
)
def test_quiet_and_verbose_set_the_level_of_the_procap_logger(flags, level):
    assert log_level(build_parser().parse_args([*flags, "info", "tiny"])) == level


def test_quiet_and_verbose_together_are_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["--quiet", "--verbose", "info", "tiny"])
    assert exit_info.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


@pytest.fixture(scope="module")
def caption_inputs(tmp_path_factory) -> argparse.Namespace:
    """A one-pair benchmark at 16 px and an untrained one-layer checkpoint."""
    from procap.data import load_split
    from procap.data.synthetic import generate
    from procap.loading.checkpoint import save_checkpoint
    from procap.train.common import build_vocab
    from tests.support import micro_model

    root = tmp_path_factory.mktemp("logs")
    generate(root / "data", 4, size=16, seed=3, progress=False)
    vocab = build_vocab(load_split("clevr-change", root / "data", "train"), "clevr-change")
    return argparse.Namespace(
        ckpt=save_checkpoint(root / "model.safetensors", micro_model(len(vocab)), vocab),
        before=root / "data" / "images" / "CLEVR_default_000000.png",
        after=root / "data" / "sc_images" / "CLEVR_semantic_000000.png",
    )


def _caption_to_file(inputs: argparse.Namespace, out: Path, *loudness: str) -> None:
    """``procap [loudness] caption ... --batch-size 500 --out FILE``: a warning (the batch is cut) and a note."""
    argv = ["caption", "--ckpt", str(inputs.ckpt), str(inputs.before), str(inputs.after), "--batch-size", "500"]
    assert main([*loudness, *argv, "--out", str(out)]) == 0


def test_quiet_keeps_the_warnings_and_drops_the_notes(caption_inputs, tmp_path, capsys):
    _caption_to_file(caption_inputs, tmp_path / "loud.jsonl")
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [
        "procap caption: --batch-size 500 is more than the 1 pairs given; using batches of 1",
        f"1 captions written to {tmp_path / 'loud.jsonl'} (0 were there already).",
    ]
    _caption_to_file(caption_inputs, tmp_path / "quiet.jsonl", "--quiet")
    out, err = capsys.readouterr()
    assert (out, err) == ("", "procap caption: --batch-size 500 is more than the 1 pairs given; using batches of 1\n")
    assert (tmp_path / "quiet.jsonl").read_text() == (tmp_path / "loud.jsonl").read_text()  # the results are the same
