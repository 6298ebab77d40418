"""The command line starts fast (issues 41 and 50).

`procap --help`, `procap COMMAND --help` and argument errors answer without importing torch; every command refuses a
missing input (or an output it cannot write) before torch is imported; and loading a model does not import
torch._dynamo, which building it on the meta device used to (half a minute of a loaded machine).

Each case runs in a fresh interpreter, since torch, once imported by any test, stays in this process's modules. The
probe runs the command and then reads ``sys.modules``: whatever imported torch, at whatever depth, shows there.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from procap.commands.cli import COMMANDS
from tests.support import subprocess_env

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "torchvision", "cv2", "h5py")
# The CPU seconds a refused command may take in its process: importing torch alone takes about one (process time,
# so a loaded machine does not stretch it as it does the wall clock); a check that needs no torch, a few hundredths.
FIRST_SECOND_CPU = 0.5

PROBE = """
import sys, time
from procap.commands.cli import main
started = time.process_time()
try:
    code = main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
cpu = time.process_time() - started
heavy = sorted({m.split('.')[0] for m in sys.modules} & set(HEAVY))
print('EXIT', code, file=sys.stderr)
print('HEAVY', ','.join(heavy), file=sys.stderr)
print('DYNAMO', 'torch._dynamo' in sys.modules, file=sys.stderr)
print('CPU', cpu, file=sys.stderr)
"""
PROBE_LINES = ("EXIT ", "HEAVY", "DYNAMO ", "CPU ")


@dataclass
class Probed:
    """What one command did in its own interpreter."""

    code: int
    heavy: list[str]  # the packages of HEAVY it imported
    dynamo: bool  # whether torch._dynamo was imported
    cpu_seconds: float  # the process time of the command, interpreter start left out
    errors: list[str]  # its stderr lines, the probe's left out
    output: str


def probe_cli(argv: list[str], cwd: Path | None = None) -> Probed:
    env = subprocess_env()
    probe = f"HEAVY = {HEAVY!r}\n{PROBE}"
    done = subprocess.run(
        [sys.executable, "-c", probe, *argv], env=env, cwd=cwd, capture_output=True, text=True, timeout=600, check=False
    )
    lines = done.stderr.splitlines()

    def field(prefix: str) -> str:
        found = next((line for line in lines if line.startswith(prefix)), None)
        assert found is not None, f"the probe did not finish:\n{done.stdout}{done.stderr}"
        return found[len(prefix) :].strip()

    heavy = [m for m in field("HEAVY").split(",") if m]
    errors = [line for line in lines if not line.startswith(PROBE_LINES)]
    return Probed(
        int(field("EXIT ")), heavy, field("DYNAMO ") == "True", float(field("CPU ")), errors, done.stdout + done.stderr
    )


def run_cli(argv: list[str]) -> tuple[int, list[str], str]:
    probed = probe_cli(argv)
    return probed.code, probed.heavy, probed.output


@pytest.mark.parametrize("argv", [["--help"], *[[name, "--help"] for name in COMMANDS]], ids=" ".join)
def test_help_does_not_import_torch(argv):
    code, heavy, output = run_cli(argv)
    assert code == 0 and "usage: procap" in output
    assert heavy == [], f"procap {' '.join(argv)} imported {heavy}"


@pytest.mark.parametrize(
    "argv",
    [
        ["no-such-command"],
        ["train", "--no-such-flag"],
        ["train", "--steps", "many"],
        ["evaluate", "--batch-size", "many"],
        ["evaluate", "--split", "no-such-split"],
        ["score", "--dataset", "no-such-dataset"],
        ["demo", "--seed", "none"],
        ["caption", "--no-such-flag"],
    ],
    ids=" ".join,
)
def test_argument_errors_do_not_import_torch(argv):
    code, heavy, output = run_cli(argv)
    assert code == 2 and "error:" in output
    assert heavy == [], f"procap {' '.join(argv)} imported {heavy}"


def test_the_probe_sees_torch_when_it_is_imported():
    # The checks above must be able to fail: torch imported before the command line shows up in the list.
    code, heavy, _ = run_cli(["--version"])
    assert code == 0 and heavy == []
    env = subprocess_env()
    done = subprocess.run(
        [sys.executable, "-c", f"HEAVY = {HEAVY!r}\nimport procap.data.images\n{PROBE}", "--version"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert "HEAVY torch" in done.stderr


# -- a missing input is refused before torch is imported (issue 50, item 4) -----------------------------------------
# One case per command: its arguments (given the folder of the files below) and what the one sentence names. Every
# file the case names exists but the missing one (an empty file: the checks before torch never read one), so the
# sentence that comes is the check of that path, and nothing after it ran.
MISSING = "missing"
FIRST_CHECKS: dict[str, tuple[Callable[[Path], list[str]], str]] = {
    "demo": (lambda d: ["--out", str(d / "a_file" / "demo")], "--out"),  # no input: an output it cannot create
    "synth": (lambda d: ["--out", str(d / "a_file" / "synth")], "--out"),
    "vocab": (lambda d: ["--dataset", "clevr-change", "--root", str(d / MISSING), "--out", str(d / "v.json")], "root"),
    "prepare": (
        lambda d: (
            ["--dataset", "clevr-change", "--root", str(d / MISSING), "--out", str(d / "cache")]
            + ["--similarity", "scores", "--scores-file", str(d / "scores.json"), "--device", "cpu"]
        ),
        "--root",
    ),
    "vqgan": (lambda d: ["--data", str(d / MISSING), "--out", str(d / "run"), "--device", "cpu"], "--data"),
    "pretrain": (
        lambda d: ["--data", str(d / "data"), "--out", str(d / "run"), "--vqgan", str(d / MISSING)],
        "--vqgan",
    ),
    "train": (lambda d: ["--data", str(d / "data"), "--out", str(d / "run"), "--init", str(d / MISSING)], "--init"),
    "evaluate": (lambda d: ["--ckpt", str(d / MISSING), "--data", str(d / "data"), "--device", "cpu"], "--ckpt"),
    "caption": (
        lambda d: ["--ckpt", str(d / MISSING), str(d / "a.png"), str(d / "b.png"), "--device", "cpu"],
        "--ckpt",
    ),
    "imagine": (
        lambda d: [str(d / "a.png"), str(d / "b.png"), "--ckpt", str(d / MISSING), "--device", "cpu"],
        "checkpoint file",
    ),
    "procedure": (
        lambda d: ["--data", str(d / MISSING), "--pair", "x.png", "--cache", str(d / "data"), "--device", "cpu"],
        "--data",
    ),
    "convert": (
        lambda d: [
            str(d / MISSING),
            "--from",
            "authors",
            "--vocab",
            str(d / "vocab.json"),
            "--out",
            str(d / "x.safetensors"),
        ],
        "authors' checkpoint",
    ),
    "score": (lambda d: ["--pred", str(d / MISSING), "--refs", str(d / "refs.json")], "prediction file"),
    "info": (lambda d: [MISSING], "unknown preset"),  # no path: a preset it does not know
    "profile": (lambda d: ["--ckpt", str(d / MISSING), "--device", "cpu"], "--ckpt"),
}
# The same refusals when the one wrong argument is another input of the commands that load a model.
MORE_CHECKS: dict[str, tuple[Callable[[Path], list[str]], str]] = {
    "evaluate --data": (
        lambda d: ["evaluate", "--ckpt", str(d / "model.safetensors"), "--data", str(d / MISSING), "--device", "cpu"],
        "root",
    ),
    "caption --pairs": (
        lambda d: ["caption", "--ckpt", str(d / "model.safetensors"), "--pairs", str(d / MISSING), "--device", "cpu"],
        "--pairs",
    ),
    "caption --out": (
        lambda d: (
            ["caption", "--ckpt", str(d / "model.safetensors"), str(d / "a.png"), str(d / "b.png")]
            + ["--out", str(d / "captions.txt"), "--device", "cpu"]
        ),
        ".jsonl or .csv",
    ),
    "profile --out": (
        lambda d: ["profile", "--ckpt", str(d / "model.safetensors"), "--out", str(d / "a_file"), "--device", "cpu"],
        "--out",
    ),
    "prepare --shard": (
        lambda d: (
            ["prepare", "--dataset", "clevr-change", "--root", str(d / "data"), "--out", str(d / "cache")]
            + ["--shard", "3/2", "--device", "cpu"]
        ),
        "--shard",
    ),
    "demo --seeds": (lambda d: ["demo", "--seeds", "65", "--out", str(d / "demo")], "--seeds"),
    "convert --vocab": (
        lambda d: (
            ["convert", str(d / "model.safetensors"), "--from", "authors", "--vocab", str(d / MISSING)]
            + ["--out", str(d / "x.safetensors")]
        ),
        "--vocab",
    ),
}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    """A folder holding what the cases name but the missing path: empty files, an empty dataset folder."""
    folder = tmp_path_factory.mktemp("inputs")
    (folder / "data").mkdir()
    for name in ("a.png", "b.png", "model.safetensors", "scores.json", "vocab.json", "refs.json", "a_file"):
        (folder / name).touch()
    return folder


def _refused_before_torch(argv: list[str], names: str, folder: Path) -> None:
    probed = probe_cli(argv, cwd=folder)
    assert probed.code == 2, probed.output
    assert len(probed.errors) == 1 and probed.errors[0].startswith("procap: error:"), probed.output
    assert names in probed.errors[0], probed.errors[0]
    assert probed.heavy == [], f"procap {argv[0]} imported {probed.heavy} before refusing: {probed.errors[0]}"
    assert probed.cpu_seconds < FIRST_SECOND_CPU, f"procap {argv[0]} took {probed.cpu_seconds:.2f} CPU s to refuse"


def test_every_command_has_a_first_check_case():
    assert sorted(FIRST_CHECKS) == sorted(COMMANDS)


@pytest.mark.parametrize("command", sorted(FIRST_CHECKS))
def test_a_missing_input_is_refused_before_torch(command, inputs):
    arguments, names = FIRST_CHECKS[command]
    _refused_before_torch([command, *arguments(inputs)], names, inputs)


@pytest.mark.parametrize("case", sorted(MORE_CHECKS))
def test_other_wrong_inputs_are_refused_before_torch(case, inputs):
    arguments, names = MORE_CHECKS[case]
    _refused_before_torch(arguments(inputs), names, inputs)


def test_the_probe_times_a_refusal_after_torch(inputs):
    # The CPU bound must be able to fail: a device check imports torch, and that alone passes it.
    probed = probe_cli(["demo", "--device", "no-such-device", "--out", str(inputs / "demo")], cwd=inputs)
    assert probed.code == 2 and "--device" in probed.errors[0] and probed.heavy == ["torch"]
    assert probed.cpu_seconds > FIRST_SECOND_CPU


# -- loading a model does not import torch._dynamo (issue 50, item 3) -----------------------------------------------


@pytest.fixture(scope="module")
def micro_checkpoint(tmp_path_factory) -> Path:
    """An untrained micro model's checkpoint and two 16 px images beside it."""
    import torch

    from procap.data import Vocabulary
    from procap.loading.checkpoint import save_checkpoint
    from tests.support import micro_model, save_png

    folder = tmp_path_factory.mktemp("micro")
    vocab = Vocabulary.build(["the cube moved", "no change"], min_count=1)
    torch.manual_seed(0)
    save_checkpoint(folder / "micro.safetensors", micro_model(len(vocab)), vocab)
    generator = torch.Generator().manual_seed(0)
    for name in ("a.png", "b.png"):
        save_png(torch.rand(3, 16, 16, generator=generator), folder / name)
    return folder / "micro.safetensors"


@pytest.mark.parametrize(
    "argv",
    [
        lambda c: ["caption", "--ckpt", str(c), str(c.parent / "a.png"), str(c.parent / "b.png"), "--device", "cpu"],
        lambda c: ["info", "tiny"],
    ],
    ids=["caption", "info"],
)
def test_loading_a_model_does_not_import_dynamo(argv, micro_checkpoint):
    probed = probe_cli(argv(micro_checkpoint))
    assert probed.code == 0, probed.output
    assert "torch" in probed.heavy  # the model was built
    assert not probed.dynamo, "building the model imported torch._dynamo (initialisation on the meta device)"


def test_the_probe_sees_dynamo_when_it_is_imported():
    # The check above must be able to fail: a command after an import of torch._dynamo shows it.
    env = subprocess_env()
    done = subprocess.run(
        [sys.executable, "-c", f"HEAVY = {HEAVY!r}\nimport torch._dynamo\n{PROBE}", "info", "tiny"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert "DYNAMO True" in done.stderr
