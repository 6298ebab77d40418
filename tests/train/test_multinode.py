"""Two torchrun "nodes" on loopback (c10d rendezvous, gloo on CPU) against one process with the same global batch.

Each node is its own ``torchrun --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:PORT``
process running ``procap train`` (docs/training.md shows the same command for real machines), so the job goes
through the rendezvous, the agents' shared store and gloo over TCP as a two-machine job does.

What must agree: stage 2 on the 16 px test model without dropout computes, with 2 nodes x batch 2, the loss and
gradient of one process with batch 4 (tests/train/test_distributed.py says why), so the logged losses agree to
float summation order and so do the weights after the run. The weights are compared to ``WEIGHT_TOL``: the two
nodes' gradients are summed by gloo (for 2 ranks a + b, the same in any order), but each half batch is reduced
on its own before that sum, and AdamW's normalised step passes that rounding on to every weight.

A killed node ends the whole job (the other node's worker fails in its next collective, and its torchrun reports
it); the run goes on with ``--resume`` on every node from the last checkpoint. torchrun's ``--max-restarts`` is not
that path across nodes: a node started again cannot join the survivors' next round, and torchrun counts restarts
per node (docs/training.md). It is the path for a crashed worker on one node, tested here through the command.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from procap.core.weights import read_tensors
from procap.train.loop import JsonlLog
from tests.support import subprocess_env

ROOT = Path(__file__).resolve().parents[2]
FAULTY_NODE = Path(__file__).with_name("faulty_node.py")
RUN_TIMEOUT_S = 240  # one training run, start-up of torch in every process included; a hang fails, never blocks CI
EXIT_TIMEOUT_S = 60  # the surviving node stops within this once its peer is killed
STOP_GRACE_S = 10  # SIGTERM to SIGKILL when a test cleans up what it started
STEPS, SAVE_EVERY, KILLED_AT = 6, 3, 5  # the killed node stops in step 5, after the step-3 checkpoint
LOSS_TOL = 2e-5  # relative, float summation order (as tests/train/test_distributed.py)
WEIGHT_TOL = 1e-6  # absolute, per weight; measured 6e-8 (2 float32 ulps of 1), with updates of 5e-3
# Key-projection biases shift every logit of a query by the same amount, which softmax ignores: their gradient is
# zero but for rounding, and AdamW scales that noise up to steps of about lr, different in every run and split.
GRADIENT_FREE = ("k_proj.bias",)

pytestmark = [
    pytest.mark.skipif(
        not dist.is_available() or not dist.is_gloo_available(), reason="torch.distributed with gloo is not built"
    ),
    pytest.mark.skipif(os.name != "posix", reason="the nodes are killed by process group (POSIX)"),
]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _env() -> dict[str, str]:
    """This checkout's procap, one thread per process, and no torchrun variables inherited from a parent job."""
    env = subprocess_env(
        OMP_NUM_THREADS="1", LOGLEVEL="INFO"
    )  # the launchers log their exit barrier: a hang shows where
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT"):
        env.pop(name, None)
    return env


def _kill_group(pid: int, signum: int) -> None:
    try:
        os.killpg(pid, signum)
    except ProcessLookupError:
        pass  # already gone


@contextmanager
def _processes() -> Iterator[list[subprocess.Popen]]:
    """A list to start processes into; whatever still runs on the way out is stopped with its process group.

    torchrun stops its workers when it gets SIGTERM (they run in sessions of their own); SIGKILL follows after
    ``STOP_GRACE_S``.
    """
    started: list[subprocess.Popen] = []
    try:
        yield started
    finally:
        for proc in started:
            if proc.poll() is None:
                _kill_group(proc.pid, signal.SIGTERM)
        for proc in started:
            try:
                proc.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                _kill_group(proc.pid, signal.SIGKILL)
                proc.wait()


def _start(started: list[subprocess.Popen], command: list[str], log: Path) -> subprocess.Popen:
    with log.open("w") as sink:  # the child keeps its own descriptor: no pipe to fill up and block on
        proc = subprocess.Popen(
            command, cwd=ROOT, env=_env(), stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
        )
    started.append(proc)
    return proc


def _tails(logs: list[Path]) -> str:
    return "\n".join(f"--- {log.name}:\n{log.read_text()[-6000:]}" for log in logs)


def _wait(procs: list[subprocess.Popen], logs: list[Path], timeout: float) -> list[int]:
    """The processes' exit codes; fails with every log's tail if one is still running after ``timeout``."""
    deadline = time.monotonic() + timeout
    for proc, log in zip(procs, logs):
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            codes = [p.poll() for p in procs]
            pytest.fail(f"{log.name} did not end within {timeout:.0f} s (exit codes {codes}):\n{_tails(logs)}")
    return [proc.returncode for proc in procs]


def _procap_args(data: Path, init: Path, out: Path, batch_size: int, *extra: str) -> list[str]:
    """``procap train`` for ``STEPS`` steps, saving every ``SAVE_EVERY``, validating once at the end on 2 pairs."""
    return [
        "train",
        *("--data", str(data), "--init", str(init), "--out", str(out), "--device", "cpu"),
        *("--batch-size", str(batch_size), "--steps", str(STEPS), "--lr", "1e-3"),
        *("--seed", "5", "--log-every", "1", "--save-every", str(SAVE_EVERY), "--save-minutes", "0"),
        *("--val-every", str(STEPS), "--val-pairs", "2", "--dist-timeout", "1", "--no-progress"),
        *extra,
    ]


def _torchrun(port: int, node: int) -> list[str]:
    """One node's launcher: the docs' two-node command with one process per node and this machine as both.

    Node 0 hosts the rendezvous store, as the machine named by ``--rdzv-endpoint`` does; on one address torchrun
    cannot tell that from the host name, so ``is_host`` says it (else whichever node starts first hosts it).
    """
    return [
        *(sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1"),
        *("--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"procap-test-{port}"),
        *("--rdzv-conf", f"is_host={int(node == 0)}"),
    ]


def _start_two_nodes(
    started: list[subprocess.Popen], args: list[str], logs: Path, stalled: tuple[Path, int] | None = None
) -> tuple[list[subprocess.Popen], list[Path]]:
    """Both nodes of one job; with ``stalled`` (marker, step) node 1 runs ``faulty_node.py stall`` instead of
    ``-m procap``."""
    port = _free_port()
    procs, paths = [], []
    for node in (0, 1):
        entry = ["-m", "procap"]
        if stalled is not None and node == 1:
            entry = [str(FAULTY_NODE), "stall", str(stalled[0]), str(stalled[1])]
        paths.append(logs / f"node{node}.log")
        procs.append(_start(started, [*_torchrun(port, node), *entry, *args], paths[-1]))
    return procs, paths


def _run_two_nodes(args: list[str], logs: Path) -> None:
    logs.mkdir(parents=True, exist_ok=True)
    with _processes() as started:
        procs, paths = _start_two_nodes(started, args, logs)
        codes = _wait(procs, paths, RUN_TIMEOUT_S)
    assert codes == [0, 0], _tails(paths)


def _run_one_process(args: list[str], logs: Path) -> None:
    logs.mkdir(parents=True, exist_ok=True)
    with _processes() as started:
        log = logs / "single.log"
        proc = _start(started, [sys.executable, "-m", "procap", *args], log)
        assert _wait([proc], [log], RUN_TIMEOUT_S) == [0], log.read_text()[-3000:]


def _losses(out: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in JsonlLog(out / "log.jsonl").records() if "loss" in r}


def _weights(out: Path) -> dict[str, torch.Tensor]:
    return read_tensors(out / "last.safetensors")[0]


def _max_weight_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], skip: tuple[str, ...] = ()) -> float:
    """The largest difference of one weight between two checkpoints, leaving out the tensors named ``*skip``."""
    assert sorted(a) == sorted(b)
    names = [name for name in a if a[name].numel() and not name.endswith(skip)]
    return max(float((a[name].double() - b[name].double()).abs().max()) for name in names)


@pytest.fixture(scope="module")
def init_checkpoint(tmp_path_factory, clevr_root) -> Path:
    """The 16 px test model (no dropout, no batch statistics) as the ``--init`` checkpoint: with it the command
    trains a model small enough for CI."""
    from procap.data import load_split
    from procap.model.checkpoint_file import save_checkpoint
    from procap.model.procap import ProCap
    from procap.train.common import build_vocab
    from tests.support import small_training_config

    vocab = build_vocab(load_split("clevr-change", clevr_root, "train"), "clevr-change")
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("init") / "init.safetensors"
    return save_checkpoint(path, ProCap(small_training_config(len(vocab))), vocab)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, clevr_root, init_checkpoint) -> dict[str, Path]:
    """The run folders of one process with batch 4 and of two nodes with batch 2 each (global batch 4)."""
    base = tmp_path_factory.mktemp("multinode")
    _run_one_process(_procap_args(clevr_root, init_checkpoint, base / "single", 4), base / "logs-single")
    _run_two_nodes(_procap_args(clevr_root, init_checkpoint, base / "nodes", 2), base / "logs-nodes")
    return {"single": base / "single", "nodes": base / "nodes"}


def test_two_nodes_match_one_process(runs, init_checkpoint):
    single, nodes = _losses(runs["single"]), _losses(runs["nodes"])
    assert sorted(single) == list(range(1, STEPS + 1))
    assert sorted(nodes) == sorted(single)
    scale = max(abs(v) for v in single.values())
    assert max(abs(nodes[s] - single[s]) for s in single) <= LOSS_TOL * scale
    single_weights, node_weights = _weights(runs["single"]), _weights(runs["nodes"])
    assert _max_weight_diff(node_weights, single_weights, skip=GRADIENT_FREE) <= WEIGHT_TOL
    trained = _max_weight_diff(single_weights, read_tensors(init_checkpoint)[0], skip=GRADIENT_FREE)
    assert trained > 100 * WEIGHT_TOL  # the steps moved the weights far more than the tolerance


def test_killed_node_resumes_from_its_last_checkpoint(runs, tmp_path, clevr_root, init_checkpoint):
    """Node 1 is killed (its torchrun and its worker) in step 5, after the step-3 checkpoint: node 0 fails on its
    own within ``EXIT_TIMEOUT_S``, and the same command on both nodes with ``--resume`` ends with the weights and
    losses of the uninterrupted two-node run."""
    out, logs = tmp_path / "run", tmp_path / "logs"
    logs.mkdir()
    marker = tmp_path / "stalled.pid"
    args = _procap_args(clevr_root, init_checkpoint, out, 2)
    with _processes() as started:
        procs, paths = _start_two_nodes(started, args, logs, stalled=(marker, KILLED_AT))
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while not marker.exists():
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                pytest.fail(f"node 1 never reached step {KILLED_AT}:\n{_tails(paths)}")
            time.sleep(0.2)
        saved_step = json.loads((out / "last.state.json").read_text())["step"]
        _kill_group(int(marker.read_text()), signal.SIGKILL)  # the worker runs in a session of its own
        _kill_group(procs[1].pid, signal.SIGKILL)
        codes = _wait(procs, paths, EXIT_TIMEOUT_S)  # fails the test if node 0 is still running then
    assert codes[0] != 0 and codes[1] == -signal.SIGKILL, codes
    assert "exitcode" in paths[0].read_text()  # node 0's torchrun reports its failed worker
    assert saved_step == SAVE_EVERY
    assert max(_losses(out)) == KILLED_AT - 1 and not (out / "best.safetensors").exists()  # it died mid-run

    _run_two_nodes([*args, "--resume"], tmp_path / "logs-resumed")
    resumed, reference = _losses(out), _losses(runs["nodes"])
    for step in range(SAVE_EVERY + 1, STEPS + 1):
        assert resumed[step] == pytest.approx(reference[step], rel=1e-6, abs=1e-7), step
    assert _max_weight_diff(_weights(out), _weights(runs["nodes"])) == 0.0


def test_torchrun_restart_of_the_command_resumes_by_itself(runs, tmp_path, clevr_root, init_checkpoint):
    """``procap train`` under ``torchrun --max-restarts 1`` (one node, 2 processes): rank 1 crashes in step 5 and the
    restarted command continues from the step-3 checkpoint without ``--resume``. It used to stop at once: the
    command refused ``--out`` ("holds a `procap train` run; pass --resume") before the restart could resume."""
    out = tmp_path / "run"
    args = _procap_args(clevr_root, init_checkpoint, out, 2)
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    log = tmp_path / "restarted.log"
    with _processes() as started:
        entry = [str(FAULTY_NODE), "crash", str(tmp_path / "unused"), str(KILLED_AT)]
        proc = _start(started, [*launcher, "--max-restarts", "1", *entry, *args], log)
        assert _wait([proc], [log], 2 * RUN_TIMEOUT_S) == [0], log.read_text()[-3000:]
    steps = [r["step"] for r in JsonlLog(out / "log.jsonl").records() if "loss" in r]
    assert steps == [1, 2, 3, 4, 4, 5, 6]  # step 4 of the first attempt, then the restart from the step-3 save
    resumed, reference = _losses(out), _losses(runs["nodes"])
    for step in range(SAVE_EVERY + 1, STEPS + 1):
        assert resumed[step] == pytest.approx(reference[step], rel=1e-6, abs=1e-7), step
    assert _max_weight_diff(_weights(out), _weights(runs["nodes"])) == 0.0


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_restart_resumes_its_own_run_only(tmp_path, monkeypatch, overwrite):
    """A restarted attempt resumes from ``<out>``'s saved state, unless the run replaces ``<out>`` (``--overwrite``
    trains beside it): that state is the replaced run's, and the restart starts over."""
    from procap.train.config import TrainConfig
    from procap.train.distributed import resume_after_restart
    from procap.train.state import state_paths

    for path in (tmp_path / "last.safetensors", *state_paths(tmp_path / "last.safetensors")):
        path.write_text("{}")
    cfg = TrainConfig(stage="train", out=str(tmp_path), overwrite=overwrite)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    assert not resume_after_restart(cfg).resume  # the first attempt is a new run
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    assert resume_after_restart(cfg).resume is not overwrite
